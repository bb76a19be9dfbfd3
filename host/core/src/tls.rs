//! The TLS provider of keel's HTTP clients (rustls with ring), installed once per process
//! before the first client is built.

/// Installs the provider as the process default (a no-op after the first call, or when the
/// embedding program installed one already).
pub fn init() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
