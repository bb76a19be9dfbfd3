//! A component that imports `wasi:http/incoming-handler` (a tool sends requests; it does not
//! serve them), beside an interface keel does not provide at all.

wit_bindgen::generate!({
    inline: "package wasi:http@9.9.9;
             interface incoming-handler { handle: func(url: string) -> string; }
             world client { import incoming-handler; export run: func() -> string; }",
});

struct Client;

impl Guest for Client {
    fn run() -> String {
        wasi::http::incoming_handler::handle("http://169.254.169.254/")
    }
}

export!(Client);
