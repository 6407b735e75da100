//! Turns a [`Generation`] into a streaming HTTP body, one token per chunk, with the
//! after-first-chunk gate and the DieMidStream fault.

use super::control::{Fault, Gate};
use super::engine::{Generation, Summary};
use bytes::Bytes;
use futures::Stream;
use std::io;

/// Protocol-specific framing of a token stream.
pub(crate) trait Framer: Send + 'static {
    /// Text sent before the first token, in the same chunk (e.g. role chunk, message_start);
    /// `cached`: the prompt tokens the prefix cache held.
    fn head(&mut self, _cached: u32) -> String {
        String::new()
    }
    fn token(&mut self, index: usize, text: &str) -> String;
    /// The terminating chunk(s): final object / usage / `[DONE]`.
    fn tail(&mut self, summary: &Summary) -> String;
}

struct St<F> {
    gen: Generation,
    framer: F,
    index: usize,
}

pub(crate) fn cut() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "sim: died mid-stream")
}

/// The body stream; an `Err` item makes the server cut the connection without a terminator.
pub(crate) fn body<F: Framer>(
    gen: Generation,
    framer: F,
) -> impl Stream<Item = io::Result<Bytes>> + Send {
    let st = St {
        gen,
        framer,
        index: 0,
    };
    futures::stream::unfold(Some(st), |st| async move {
        let mut st = st?;
        if st.index == 0 {
            let mut out = st.framer.head(st.gen.cached_tokens());
            return match st.gen.next_token().await {
                Some(t) => {
                    out.push_str(&st.framer.token(0, &t));
                    st.index = 1;
                    Some((Ok(Bytes::from(out)), Some(st)))
                }
                None => {
                    let s = st.gen.finish();
                    out.push_str(&st.framer.tail(&s));
                    Some((Ok(Bytes::from(out)), None))
                }
            };
        }
        if st.index == 1 {
            let ctl = st.gen.control().clone();
            if ctl.park(Gate::AfterFirstChunk).await.is_err() {
                return Some((Err(cut()), None));
            }
            st.gen.rebase();
        }
        if st.gen.control().fault() == Fault::DieMidStream {
            // Let the server flush what was sent so far, then cut.
            tokio::task::yield_now().await;
            return Some((Err(cut()), None));
        }
        let i = st.index;
        match st.gen.next_token().await {
            Some(t) => {
                let out = st.framer.token(i, &t);
                st.index += 1;
                Some((Ok(Bytes::from(out)), Some(st)))
            }
            None => {
                let s = st.gen.finish();
                Some((Ok(Bytes::from(st.framer.tail(&s))), None))
            }
        }
    })
}

/// A body that is cut before any data (non-streaming request on a node that dies).
pub(crate) fn dead_body() -> impl Stream<Item = io::Result<Bytes>> + Send {
    futures::stream::once(async { Err(cut()) })
}
