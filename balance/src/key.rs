//! Finding a request's slice key.

use steady_slice::SliceKey;

/// Reads the slice key of a request, if it has one.
///
/// Requests without a key are balanced over the subset. Implemented by closures
/// `Fn(&Req) -> Option<SliceKey>` and by [`NoKey`].
pub trait KeyExtractor<Req>: Clone + Send + Sync + 'static {
    /// The request's slice key, or `None` for an unkeyed request.
    fn slice_key(&self, req: &Req) -> Option<SliceKey>;
}

/// The extractor of a balancer without keyed routing: every request is unkeyed.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoKey;

impl<Req> KeyExtractor<Req> for NoKey {
    #[inline]
    fn slice_key(&self, _req: &Req) -> Option<SliceKey> {
        None
    }
}

impl<Req, F> KeyExtractor<Req> for F
where
    F: Fn(&Req) -> Option<SliceKey> + Clone + Send + Sync + 'static,
{
    #[inline]
    fn slice_key(&self, req: &Req) -> Option<SliceKey> {
        self(req)
    }
}
