//! A component that imports a granted interface (`wasi:cli/environment`) but asks it for
//! functions the host does not have: the link refusal must name every one of them.

wit_bindgen::generate!({
    inline: "package wasi:cli@0.9.0;
             interface environment {
                 get-arguments: func() -> list<string>;
                 get-secret-key: func() -> string;
                 get-host-name: func() -> string;
             }
             world probe { import environment; export run: func() -> string; }",
});

struct Probe;

impl Guest for Probe {
    fn run() -> String {
        let _ = wasi::cli::environment::get_arguments();
        wasi::cli::environment::get_secret_key() + &wasi::cli::environment::get_host_name()
    }
}

export!(Probe);
