//! Trace export over OTLP/HTTP (JSON) to the operator's collector, through
//! toolgate's own HTTP client: the spans toolgate makes (`tool.execute` and
//! its children, with identity and classification, never arguments or
//! results) become OpenTelemetry spans, and a control API request's W3C
//! `traceparent` continues the caller's trace.
//!
//! The exporter runs on the SDK's own thread; its requests run on a small
//! runtime of their own, so exporting never competes with calls.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::registry::LookupSpan;

/// How long one export request may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest collector answer read.
const MAXIMUM_ANSWER: usize = 1 << 20;

/// Why export could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// The exporter refused its settings.
    #[error("telemetry: {0}")]
    Exporter(String),
    /// The export runtime could not start.
    #[error("telemetry: the export runtime: {0}")]
    Runtime(String),
}

/// Where and how much to export.
#[derive(Debug, Clone)]
pub struct OtlpSettings {
    /// The collector's traces endpoint (`http://…/v1/traces`).
    pub endpoint: String,
    /// The share of new traces kept.
    pub sampling_ratio: f64,
    /// The spans' `service.name`.
    pub service_name: String,
}

/// Keeps export running; dropping it (or [`TraceExport::shutdown`]) sends
/// what is buffered.
pub struct TraceExport {
    provider: SdkTracerProvider,
}

impl TraceExport {
    /// Sends what is buffered and stops.
    pub fn shutdown(&self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(error = %error, "trace export did not shut down cleanly");
        }
    }
}

/// The HTTP client the exporter sends through: plain HTTP to the operator's
/// collector, on a runtime thread of its own.
#[derive(Debug, Clone)]
struct CollectorClient {
    runtime: tokio::runtime::Handle,
}

impl CollectorClient {
    fn start() -> Result<Self, OtlpError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| OtlpError::Runtime(error.to_string()))?;
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("toolgate-otlp".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .map_err(|error| OtlpError::Runtime(error.to_string()))?;
        Ok(CollectorClient { runtime: handle })
    }
}

async fn post(request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
    let uri = request.uri().clone();
    let host = uri.host().ok_or("the endpoint has no host")?.to_owned();
    let port = uri.port_u16().unwrap_or(80);
    // The operator's collector, named in the configuration: not a dial on
    // a tenant's or a server's behalf, so not egress's.
    let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let (mut parts, body) = request.into_parts();
    parts.uri = uri
        .path_and_query()
        .map(|path| path.as_str())
        .unwrap_or("/")
        .parse()?;
    parts
        .headers
        .insert(hyper::header::HOST, format!("{host}:{port}").parse()?);
    let response = sender
        .send_request(hyper::Request::from_parts(parts, Full::new(body)))
        .await?;
    let (parts, body) = response.into_parts();
    let bytes = Limited::new(body, MAXIMUM_ANSWER)
        .collect()
        .await
        .map_err(|error| error.to_string())?
        .to_bytes();
    Ok(Response::from_parts(parts, bytes))
}

impl HttpClient for CollectorClient {
    fn send_bytes<'life0, 'async_trait>(
        &'life0 self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        // The exporter's thread has no runtime: the deadline too is made on
        // the client's own.
        let task = self
            .runtime
            .spawn(async move { tokio::time::timeout(EXPORT_TIMEOUT, post(request)).await });
        Box::pin(async move {
            match task.await {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) => Err("the collector did not answer in time".into()),
                Err(error) => Err(error.to_string().into()),
            }
        })
    }
}

/// The tracing layer that exports toolgate's spans, and its guard.
pub fn layer<S>(
    settings: &OtlpSettings,
) -> Result<(impl tracing_subscriber::Layer<S> + use<S>, TraceExport), OtlpError>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(CollectorClient::start()?)
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(settings.endpoint.clone())
        .build()
        .map_err(|error| OtlpError::Exporter(error.to_string()))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            settings.sampling_ratio,
        ))))
        .with_resource(
            Resource::builder_empty()
                .with_service_name(settings.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("toolgate");
    let layer = tracing_opentelemetry::layer().with_tracer(tracer);
    Ok((layer, TraceExport { provider }))
}

/// Makes `span` a child of the W3C `traceparent` a caller sent, when it is
/// one, carrying its `tracestate`; anything else is ignored (the span starts
/// a trace of its own).
pub fn continue_trace(span: &tracing::Span, traceparent: &str, tracestate: Option<&str>) {
    let mut carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    if let Some(tracestate) = tracestate {
        carrier.insert("tracestate".to_owned(), tracestate.to_owned());
    }
    let context = TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(context);
}
