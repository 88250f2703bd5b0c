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

/// What is needed to send a request again: its head and its buffered body. Kept beside
/// every replayable request in flight, so it is built for the price of one header map
/// (the bytes are shared, the extensions moved); a request is made of it only when one
/// is sent again.
#[derive(Debug)]
pub(crate) struct Replay {
    method: http::Method,
    uri: http::Uri,
    version: http::Version,
    headers: HeaderMap,
    extensions: http::Extensions,
    body: Buffered,
}

impl Replay {
    /// A request like the original (the same head, extensions and bytes); the replay
    /// stays, for a further move.
    pub(crate) fn request(&self) -> http::Request<Body> {
        let mut req = http::Request::new(Body::new(self.body.copy()));
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers.clone();
        *req.extensions_mut() = self.extensions.clone();
        req
    }

    /// The request like the original, taking the replay.
    pub(crate) fn into_request(self) -> http::Request<Body> {
        let mut req = http::Request::new(Body::new(self.body.into_frames()));
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers;
        *req.extensions_mut() = self.extensions;
        req
    }
}

/// Makes `req` replayable if its body is complete and at most [`MAX_REPLAY_BYTES`]:
/// its body is replaced by the buffered bytes, and what it takes to send it again is
/// returned. Otherwise `None`, and `req` sends exactly what it would have.
///
/// The request's extensions *move* to the [`Replay`] (the request keeps none): nothing
/// below the balancer reads them (tonic's transport and hyper's HTTP/2 client send
/// headers, not extensions), and moving them costs nothing where cloning them costs a
/// map. So read what the routing needs from them (the slice key) before.
pub(crate) fn replayable(req: &mut http::Request<Body>) -> Option<Replay> {
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
    Some(Replay {
        method: req.method().clone(),
        uri: req.uri().clone(),
        version: req.version(),
        headers: req.headers().clone(),
        extensions: std::mem::take(req.extensions_mut()),
        body: read,
    })
}

/// Whether `error` proves that its request never left, anywhere in the chain of
/// sources: a connection that could not be made (tonic's `ConnectError`), or a request
/// hyper canceled before it started it (`hyper::Error::is_canceled`: the connection
/// closed, or was not ready, while the request waited for it; hyper hands such a request
/// back unsent). A request that was started and then failed proves nothing.
pub(crate) fn never_sent(error: &(dyn Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.is::<tonic::ConnectError>() {
            return true;
        }
        if error.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_canceled) {
            return true;
        }
        next = error.source();
    }
    false
}

/// The frames read from a body. A unary request's body is one data frame: it is kept
/// apart from the others, so that buffering and copying it allocate nothing.
#[derive(Debug, Default)]
struct Buffered {
    first: Option<Bytes>,
    more: Vec<Bytes>,
    trailers: Option<HeaderMap>,
    bytes: usize,
    error: Option<Status>,
}

impl Buffered {
    fn push(&mut self, frame: Frame<Bytes>) {
        match frame.into_data() {
            Ok(data) => {
                self.bytes += data.len();
                if self.first.is_none() && self.more.is_empty() {
                    self.first = Some(data);
                } else {
                    self.more.push(data);
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    self.trailers = Some(trailers);
                }
            }
        }
    }

    /// A body of the same frames (the bytes are shared, not copied).
    fn copy(&self) -> Frames {
        Frames {
            first: self.first.clone(),
            more: self.more.clone().into_iter(),
            trailers: self.trailers.clone(),
            error: None,
            rest: None,
        }
    }

    /// A body of these frames, taking them.
    fn into_frames(self) -> Frames {
        Frames {
            first: self.first,
            more: self.more.into_iter(),
            trailers: self.trailers,
            error: None,
            rest: None,
        }
    }

    /// These frames, then the error met, then the rest of the original body.
    fn then(self, rest: Body) -> Frames {
        let error = self.error;
        Frames {
            first: self.first,
            more: self.more.into_iter(),
            trailers: self.trailers,
            error,
            rest: Some(rest),
        }
    }
}

/// A request body: buffered frames (data, then trailers), then an error or the rest of
/// the original body.
#[derive(Debug)]
struct Frames {
    first: Option<Bytes>,
    more: std::vec::IntoIter<Bytes>,
    trailers: Option<HeaderMap>,
    error: Option<Status>,
    rest: Option<Body>,
}

impl HttpBody for Frames {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(data) = self.first.take().or_else(|| self.more.next()) {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(trailers) = self.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        if let Some(error) = self.error.take() {
            return Poll::Ready(Some(Err(error)));
        }
        match &mut self.rest {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    // With nothing left after the last frame, hyper ends the stream on that frame's
    // DATA (END_STREAM set) instead of sending an empty one after it.
    fn is_end_stream(&self) -> bool {
        self.first.is_none()
            && self.more.len() == 0
            && self.trailers.is_none()
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
        let replay = replayable(&mut req).expect("complete");
        // The extensions moved to the replay: the request on the wire carries none.
        assert!(req.extensions().is_empty());
        for copy in [replay.request(), replay.request()] {
            assert_eq!((copy.method(), copy.uri(), copy.headers()), (req.method(), req.uri(), req.headers()));
            assert_eq!(copy.extensions().get::<u32>(), Some(&7));
            assert_eq!(bytes(copy.into_body()).await, "hello");
        }
        let last = replay.into_request();
        assert_eq!((last.uri(), last.extensions().get::<u32>()), (req.uri(), Some(&7)));
        assert_eq!(bytes(last.into_body()).await, "hello");
        assert_eq!(bytes(req.into_body()).await, "hello");
        let mut empty = request(Body::empty());
        assert_eq!(bytes(replayable(&mut empty).unwrap().request().into_body()).await, "");
    }

    #[tokio::test]
    async fn frames_come_back_in_order_and_end_with_the_last() {
        use http_body_util::StreamBody;
        let frames: Vec<Result<Frame<Bytes>, Status>> = vec![
            Ok(Frame::data(Bytes::from_static(b"a"))),
            Ok(Frame::data(Bytes::from_static(b"b"))),
            Ok(Frame::data(Bytes::from_static(b"c"))),
        ];
        let mut req = request(Body::new(StreamBody::new(futures_util::stream::iter(frames))));
        let replay = replayable(&mut req).expect("complete");
        let mut copy = replay.request().into_body();
        let mut seen = Vec::new();
        while let Some(frame) = copy.frame().await {
            seen.push(frame.unwrap().into_data().unwrap());
            // After the last data frame the body says it has ended, so hyper sends
            // END_STREAM on that frame.
            assert_eq!(copy.is_end_stream(), seen.len() == 3);
        }
        assert_eq!(seen, ["a", "b", "c"]);
        assert_eq!(bytes(req.into_body()).await, "abc");
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
    fn a_connection_that_could_not_be_made_proves_a_request_unsent_and_other_errors_do_not() {
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
