//! The OTLP/HTTP span exporter: one tracer provider per process, batching spans on the
//! SDK's own thread (the request path only queues a finished span; a full queue drops it),
//! posting protobuf to `{otlp_endpoint}/v1/traces`.
//!
//! Sampling is parent-based: a trace continued from a trusted caller keeps the caller's
//! sampled flag; a new trace is sampled with `telemetry.sampling_ratio` (by trace id, so
//! every gateway in a fleet agrees). The batch delay, queue size and export timeout follow
//! the SDK's standard `OTEL_BSP_*` environment variables.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use crate::config::TelemetrySettings;

/// How long one export may take before the batch is dropped.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The exporter could not be built from `telemetry.otlp_endpoint`.
#[derive(Debug, thiserror::Error)]
#[error("telemetry.otlp_endpoint: cannot build the OTLP exporter: {0}")]
pub struct ExportSetupError(#[from] opentelemetry_otlp::ExporterBuildError);

/// Installs the process's tracer provider when `otlp_endpoint` is set (once: a second call
/// keeps the first). Nothing is started when it is not.
pub fn install(settings: &TelemetrySettings) -> Result<(), ExportSetupError> {
    let Some(endpoint) = &settings.otlp_endpoint else {
        return Ok(());
    };
    if PROVIDER.get().is_some() {
        return Ok(());
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{endpoint}/v1/traces"))
        .with_timeout(EXPORT_TIMEOUT)
        .build()?;
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
        settings.sampling_ratio,
    )));
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler)
        .with_resource(
            Resource::builder()
                .with_service_name(settings.service_name.clone())
                .build(),
        )
        .build();
    let _ = PROVIDER.set(provider);
    Ok(())
}

/// The installed tracer, if any.
pub(crate) fn tracer() -> Option<SdkTracer> {
    PROVIDER.get().map(|provider| provider.tracer("portcullis"))
}

/// Flushes queued spans and stops the export thread (blocking: call off the runtime).
pub fn shutdown() {
    if let Some(provider) = PROVIDER.get() {
        if let Err(err) = provider.shutdown() {
            tracing::warn!(error = %err, "trace export did not shut down cleanly");
        }
    }
}
