//! A valid component that targets some other world.

wit_bindgen::generate!({
    inline: "package test:other; world other { export run: func() -> u32; }",
});

struct Other;

impl Guest for Other {
    fn run() -> u32 {
        7
    }
}

export!(Other);
