//! SIGHUP as a stream of reload requests, shared by the certificate reload (`tls::watch`) and
//! the configuration reload (`start::reload`): each installs its own handler and both hear
//! every signal.

/// The SIGHUP handler of one reload task.
#[derive(Debug)]
pub(crate) struct Hangup {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangup {
    /// Installs the handler; when that fails, logs it with `otherwise` (what still triggers
    /// the task) and never reports a signal.
    pub(crate) fn install(otherwise: &'static str) -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let signal = match signal(SignalKind::hangup()) {
                Ok(signal) => Some(signal),
                Err(err) => {
                    tracing::warn!(%err, "cannot install the SIGHUP handler; {otherwise}");
                    None
                }
            };
            Self { signal }
        }
        #[cfg(not(unix))]
        {
            let _ = otherwise;
            Self {}
        }
    }

    /// The next SIGHUP; pending forever without a handler (or once its stream has ended,
    /// which cannot happen on Unix).
    pub(crate) async fn received(&mut self) {
        #[cfg(unix)]
        if let Some(signal) = self.signal.as_mut() {
            if signal.recv().await.is_some() {
                return;
            }
            self.signal = None;
        }
        std::future::pending().await
    }
}
