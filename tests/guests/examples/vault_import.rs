//! A component that imports a host interface keel does not link for tools.

wit_bindgen::generate!({
    inline: "package keel:vault@0.1.0;
             interface secrets { get: func(name: string) -> string; }
             world vault { import secrets; export run: func() -> string; }",
});

struct Vault;

impl Guest for Vault {
    fn run() -> String {
        keel::vault::secrets::get("token")
    }
}

export!(Vault);
