//! A component that imports `wasi:http`, which keel does not link for tools, beside an
//! interface it does not provide at all.

wit_bindgen::generate!({
    inline: "package wasi:http@9.9.9;
             interface outgoing-handler { handle: func(url: string) -> string; }
             world client { import outgoing-handler; export run: func() -> string; }",
});

struct Client;

impl Guest for Client {
    fn run() -> String {
        wasi::http::outgoing_handler::handle("http://169.254.169.254/")
    }
}

export!(Client);
