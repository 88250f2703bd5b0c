//! Requests that were never sent move on: a copy of each request whose body is already
//! complete, and the errors that prove a request did not leave.
//!
//! A tonic `Channel` reports a connection it could not (re)make from the call's future,
//! not from `poll_ready`: a request picked for a backend that died while idle fails
//! although nothing was sent. Such a request may safely go to another member, if there
//! is still a request to send: the original's body was handed to the failed call. So
//! before the call, [`replayable`] reads the body's frames that are there already; when
//! the body ends without waiting (a unary or server-streaming call: one encoded message)
//! and is small, both the request and a copy get the buffered bytes. A body that would
//! wait (a client stream still being written) or is large is left as it was (the frames
//! read put back in front) and is not replayed.

use std::collections::VecDeque;
use std::error::Error;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame};
use tonic::body::Body;
use tonic::Status;

/// The largest request body kept for a replay: 64 KiB. Larger requests are sent once.
pub const MAX_REPLAY_BYTES: usize = 64 * 1024;

/// Makes `req` replayable if its body is complete and at most [`MAX_REPLAY_BYTES`]:
/// its body is replaced by the buffered bytes, and a copy (same method, URI, version,
/// headers, extensions and bytes) is returned. Otherwise `None`, and `req` sends
/// exactly what it would have.
pub(crate) fn replayable(req: &mut http::Request<Body>) -> Option<http::Request<Body>> {
    let mut cx = Context::from_waker(Waker::noop());
    let mut read = Buffered::default();
    let body = req.body_mut();
    let complete = loop {
        match Pin::new(&mut *body).poll_frame(&mut cx) {
            Poll::Ready(None) => break true,
            Poll::Ready(Some(Ok(frame))) => {
                read.push(frame);
                if read.bytes > MAX_REPLAY_BYTES {
                    break false;
                }
            }
            Poll::Ready(Some(Err(status))) => {
                read.error = Some(status);
                break false;
            }
            Poll::Pending => break false,
        }
    };
    if !complete {
        // Put back what was read, in front of the rest.
        let rest = std::mem::take(body);
        *body = Body::new(read.then(rest));
        return None;
    }
    *body = Body::new(read.copy());
    let mut copy = http::Request::new(Body::new(read.copy()));
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    *copy.extensions_mut() = req.extensions().clone();
    Some(copy)
}

/// Whether `error` proves its request was never sent: somewhere in its chain, a
/// connection that could not be made (tonic's `ConnectError`). Nothing else qualifies:
/// a request that may have reached a server is never sent twice.
pub(crate) fn never_sent(error: &(dyn Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.is::<tonic::ConnectError>() {
            return true;
        }
        next = error.source();
    }
    false
}

/// The frames of a request body read so far.
#[derive(Debug, Default)]
struct Buffered {
    data: Vec<Bytes>,
    trailers: Option<HeaderMap>,
    bytes: usize,
    error: Option<Status>,
}

impl Buffered {
    fn push(&mut self, frame: Frame<Bytes>) {
        match frame.into_data() {
            Ok(data) => {
                self.bytes += data.len();
                self.data.push(data);
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    self.trailers = Some(trailers);
                }
            }
        }
    }

    /// The frames read, data then trailers (cloning `Bytes` only bumps a count).
    fn frames(&self) -> VecDeque<Frame<Bytes>> {
        let data = self.data.iter().cloned().map(Frame::data);
        data.chain(self.trailers.clone().map(Frame::trailers)).collect()
    }

    /// A body of the frames read, complete.
    fn copy(&self) -> Replay {
        Replay { frames: self.frames(), error: None, rest: None }
    }

    /// A body of the frames read, then `rest`.
    fn then(self, rest: Body) -> Replay {
        Replay { frames: self.frames(), error: self.error, rest: Some(rest) }
    }
}

/// A request body: buffered frames, then an error or the rest of the original body.
#[derive(Debug)]
struct Replay {
    frames: VecDeque<Frame<Bytes>>,
    error: Option<Status>,
    rest: Option<Body>,
}

impl HttpBody for Replay {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(frame) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if let Some(error) = self.error.take() {
            return Poll::Ready(Some(Err(error)));
        }
        match &mut self.rest {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
            && self.error.is_none()
            && self.rest.as_ref().is_none_or(HttpBody::is_end_stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn request(body: Body) -> http::Request<Body> {
        let mut req = http::Request::builder()
            .uri("http://backend/echo.Echo/Echo")
            .header("x-slice-key", "k")
            .body(body)
            .unwrap();
        req.extensions_mut().insert(7u32);
        req
    }

    async fn bytes(body: Body) -> Bytes {
        body.collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn a_complete_body_is_copied_with_the_request_parts() {
        let mut req = request(Body::new(http_body_util::Full::new(Bytes::from_static(b"hello"))));
        let copy = replayable(&mut req).expect("complete");
        assert_eq!((copy.method(), copy.uri(), copy.headers()), (req.method(), req.uri(), req.headers()));
        assert_eq!(copy.extensions().get::<u32>(), Some(&7));
        assert_eq!(bytes(copy.into_body()).await, "hello");
        assert_eq!(bytes(req.into_body()).await, "hello");
        let mut empty = request(Body::empty());
        assert_eq!(bytes(replayable(&mut empty).unwrap().into_body()).await, "");
    }

    #[tokio::test]
    async fn a_body_still_being_written_is_left_whole_and_not_copied() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Status>>(4);
        tx.send(Ok(Frame::data(Bytes::from_static(b"first ")))).await.unwrap();
        let mut req = request(Body::new(http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )));
        assert!(replayable(&mut req).is_none());
        tx.send(Ok(Frame::data(Bytes::from_static(b"second")))).await.unwrap();
        drop(tx);
        assert_eq!(bytes(req.into_body()).await, "first second");
    }

    #[tokio::test]
    async fn a_large_body_is_sent_once() {
        let big = Bytes::from(vec![7u8; MAX_REPLAY_BYTES + 1]);
        let mut req = request(Body::new(http_body_util::Full::new(big.clone())));
        assert!(replayable(&mut req).is_none());
        assert_eq!(bytes(req.into_body()).await, big);
    }

    #[test]
    fn only_a_connection_that_could_not_be_made_proves_a_request_unsent() {
        let connect: Box<dyn Error + Send + Sync> = Box::new(tonic::ConnectError("refused".into()));
        // Wrapped as tower's buffer wraps it: the cause is found in the chain.
        #[derive(Debug)]
        struct Wrapper(Box<dyn Error + Send + Sync>);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "buffered service failed")
            }
        }
        impl Error for Wrapper {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&*self.0)
            }
        }
        assert!(never_sent(&Wrapper(connect)));
        assert!(!never_sent(&Status::unavailable("connection reset")));
        assert!(!never_sent(&std::io::Error::other("broken pipe")));
    }
}
