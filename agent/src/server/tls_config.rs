//! :10250's TLS configuration kept current without a restart: the
//! serving certificate from the serving certificate's manager
//! (serverTLSBootstrap) or from the files, and the server configuration
//! rebuilt when `--client-ca-file` changes (the next connections get it).

use std::sync::Arc;

use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Server, ServerError, listen, tls};

impl Server {
    /// :10250's TLS configuration, rebuilt when the client CA file
    /// changes; its certificate comes from the serving certificate's
    /// manager (serverTLSBootstrap) or the files (`tls.rs`).
    pub(super) fn tls_config(
        &self,
        shutdown: &CancellationToken,
        tasks: &mut Vec<JoinHandle<()>>,
    ) -> Result<listen::TlsConfig, ServerError> {
        let k = &self.config.kubelet;
        let resolver: Arc<dyn rustls::server::ResolvesServerCert> = match &self.serving {
            Some(m) => {
                let r = Arc::new(crate::certs::ServingResolver::new(None));
                tasks.push(r.follow(m.current(), shutdown.clone()));
                info!("serving certificate: requested through a CSR (serverTLSBootstrap)");
                r
            }
            None => {
                let cert = tls::serving_cert(
                    k.tls_cert_file.as_deref(),
                    k.tls_private_key_file.as_deref(),
                    &self.config.flags.cert_dir,
                    &self.node_name,
                )?;
                info!("serving certificate: {}", cert.source);
                tls::fixed_resolver(cert)?
            }
        };
        let (suites, min) = (k.tls_cipher_suites.clone(), k.tls_min_version.clone());
        let ca = self.client_ca.clone();
        let build = move || {
            let roots = ca.as_ref().map(|c| c.roots());
            tls::server_config(resolver.clone(), roots.as_deref(), &suites, min.as_deref())
        };
        let (tx, rx) = watch::channel(build()?);
        if let Some(ca) = self.client_ca.clone() {
            tasks.push(tokio::spawn(ca.clone().watch(tls::CLIENT_CA_CHECK, shutdown.clone())));
            let mut changes = ca.subscribe();
            let stop = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    tokio::select! {
                        r = changes.changed() => if r.is_err() { return },
                        _ = stop.cancelled() => return,
                    }
                    match build() {
                        Ok(c) => {
                            tx.send_replace(c);
                        }
                        Err(e) => warn!("the TLS configuration was not rebuilt for the new client CA: {e}"),
                    }
                }
            }));
        }
        Ok(rx)
    }
}
