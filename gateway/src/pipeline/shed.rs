//! Load shedding: over the global in-flight cap, answer 503 + `Retry-After` at once rather
//! than queue. The permit is held by the response body, so a slow download still counts as
//! in flight until its last byte.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response};
use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::pipeline::step::{Finish, Step};
use portcullis_problem::Problem;

/// What a shed client is told to wait: long enough to spread a herd, short enough to be useful.
pub const SHED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Caps concurrent requests (a [`Step`]; clones share the cap).
#[derive(Debug, Clone)]
pub(crate) struct LoadShed {
    permits: Arc<Semaphore>,
}

impl LoadShed {
    /// At most `max_in_flight` requests at once.
    pub(crate) fn new(max_in_flight: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(max_in_flight)),
        }
    }
}

impl Step for LoadShed {
    type Finish = InFlight;

    fn step(&self, _request: &mut Request<Body>) -> Result<InFlight, Response<Body>> {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            metrics::counter!("load_shed_total").increment(1);
            return Err(Problem::overloaded(SHED_RETRY_AFTER).into_response());
        };
        Ok(InFlight(permit))
    }
}

/// The permit of a request let through; handed on to its response body.
pub(crate) struct InFlight(OwnedSemaphorePermit);

impl Finish for InFlight {
    fn finish(self, response: Response<Body>) -> Response<Body> {
        response.map(|body| {
            Body::new(PermitBody {
                inner: body,
                _permit: self.0,
            })
        })
    }
}

/// A body that keeps an in-flight permit until it is dropped.
struct PermitBody {
    inner: Body,
    _permit: OwnedSemaphorePermit,
}

impl http_body::Body for PermitBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::step::StepLayer;
    use tower::{Layer, ServiceExt};

    #[tokio::test]
    async fn sheds_over_the_cap_and_releases_with_the_body() {
        let layer = StepLayer::new(LoadShed::new(1));
        let service = layer.layer(tower::service_fn(|_req: Request<Body>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Body::from("hello")))
        }));
        let held = service
            .clone()
            .oneshot(Request::new(Body::empty()))
            .await
            .unwrap();
        let shed = service
            .clone()
            .oneshot(Request::new(Body::empty()))
            .await
            .unwrap();
        assert_eq!(shed.status(), 503);
        assert_eq!(shed.headers()["retry-after"], "1");
        drop(held);
        let ok = service.oneshot(Request::new(Body::empty())).await.unwrap();
        assert_eq!(ok.status(), 200);
    }
}
