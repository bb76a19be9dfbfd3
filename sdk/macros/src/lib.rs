//! The derive macros of `keel-sdk`. Use them through `keel-sdk` (`keel_sdk::JsonSchema`); this
//! crate is not meant to be depended on directly.
//!
//! `#[derive(keel_sdk::JsonSchema)]` derives `schemars::JsonSchema` for a tool's input and
//! output types in a crate that depends on `keel-sdk` alone. The schema is `schemars`' own:
//! the derive writes a hidden copy of the type (same fields, doc comments, `serde` and
//! `schemars` attributes, same name in the schema) that `schemars`' derive handles through
//! `keel_sdk::schemars`, and implements the trait for the type by delegating to that copy.

use proc_macro::TokenStream;
use quote::{format_ident, quote};
use syn::{Attribute, Data, DeriveInput, Fields, parse_macro_input};

/// Derives `keel_sdk::schemars::JsonSchema` (see the crate's documentation).
#[proc_macro_derive(JsonSchema, attributes(schemars, serde))]
pub fn derive_json_schema(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(input) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// The attributes the copy keeps: what the schema is made of.
fn kept(attrs: &[Attribute]) -> Vec<Attribute> {
    attrs
        .iter()
        .filter(|a| ["doc", "serde", "schemars"].iter().any(|n| a.path().is_ident(n)))
        .cloned()
        .collect()
}

/// Whether the container names itself in the schema already (`rename` in a `serde` or
/// `schemars` attribute).
fn renamed(attrs: &[Attribute]) -> bool {
    attrs.iter().filter(|a| a.path().is_ident("serde") || a.path().is_ident("schemars")).any(|a| {
        let mut found = false;
        let _ = a.parse_nested_meta(|m| {
            if m.path.is_ident("rename") {
                found = true;
            }
            if m.input.peek(syn::Token![=]) {
                let _: syn::Expr = m.value()?.parse()?;
            } else if m.input.peek(syn::token::Paren) {
                let content;
                syn::parenthesized!(content in m.input);
                let _: proc_macro2::TokenStream = content.parse()?;
            }
            Ok(())
        });
        found
    })
}

fn strip_fields(fields: &mut Fields) {
    for f in fields.iter_mut() {
        f.attrs = kept(&f.attrs);
    }
}

fn expand(input: DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let name = input.ident.clone();
    let copy_name = format_ident!("__KeelSchemaOf{}", name);
    let mut copy = input.clone();
    copy.ident = copy_name.clone();
    copy.attrs = kept(&input.attrs);
    match &mut copy.data {
        Data::Struct(s) => strip_fields(&mut s.fields),
        Data::Enum(e) => {
            for v in e.variants.iter_mut() {
                v.attrs = kept(&v.attrs);
                strip_fields(&mut v.fields);
            }
        }
        Data::Union(u) => {
            return Err(syn::Error::new(
                u.union_token.span,
                "JsonSchema cannot be derived for a union: use a struct or an enum",
            ));
        }
    }
    let rename = (!renamed(&input.attrs)).then(|| {
        let shown = name.to_string();
        quote! { #[schemars(rename = #shown)] }
    });
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let mut where_clause = where_clause.cloned().unwrap_or_else(|| syn::parse_quote!(where));
    for p in input.generics.type_params() {
        let t = &p.ident;
        where_clause.predicates.push(syn::parse_quote!(#t: ::keel_sdk::schemars::JsonSchema));
    }
    Ok(quote! {
        const _: () = {
            #[derive(::keel_sdk::schemars::JsonSchema)]
            #[schemars(crate = "::keel_sdk::schemars")]
            #rename
            #[allow(dead_code, non_camel_case_types, clippy::all)]
            #copy

            #[automatically_derived]
            impl #impl_generics ::keel_sdk::schemars::JsonSchema for #name #ty_generics #where_clause {
                fn inline_schema() -> bool {
                    <#copy_name #ty_generics as ::keel_sdk::schemars::JsonSchema>::inline_schema()
                }

                fn schema_name() -> ::std::borrow::Cow<'static, str> {
                    <#copy_name #ty_generics as ::keel_sdk::schemars::JsonSchema>::schema_name()
                }

                fn schema_id() -> ::std::borrow::Cow<'static, str> {
                    <#copy_name #ty_generics as ::keel_sdk::schemars::JsonSchema>::schema_id()
                }

                fn json_schema(
                    generator: &mut ::keel_sdk::schemars::SchemaGenerator,
                ) -> ::keel_sdk::schemars::Schema {
                    <#copy_name #ty_generics as ::keel_sdk::schemars::JsonSchema>::json_schema(generator)
                }
            }
        };
    })
}
