//! The `infergate-precise` policy's extra input: each pod's KV-cache events, turned into the
//! exact cached prompt tokens of every pod for each pick.

use std::net::SocketAddr;
use std::sync::Arc;

use infergate_sim::{Fleet, KvView, Prompt};

use super::pod_addr;

/// What the `infergate-precise` policy knows beyond the preset: the pods' KV-cache events.
#[derive(Debug)]
pub struct Precise {
    view: KvView,
    tokens: Vec<u32>,
    cached: Vec<(SocketAddr, u32)>,
}

impl Precise {
    /// Subscribes to every pod of `fleet` (turning its event recording on), with events applied
    /// `lag` seconds after the pod publishes them.
    pub fn new(fleet: &mut Fleet, lag: f64) -> Self {
        Precise {
            view: KvView::new(fleet, lag),
            tokens: Vec::new(),
            cached: Vec::new(),
        }
    }

    /// Every pod's cached prompt tokens for `text` by the events delivered up to the fleet's
    /// current time, as the pick's [`RequestContext::cached`] (every pod listed, 0 included).
    pub fn cached(&mut self, fleet: &mut Fleet, text: &Arc<str>) -> &[(SocketAddr, u32)] {
        self.view.sync(fleet);
        self.view
            .cached_tokens(&Prompt::Text(text.clone()), &mut self.tokens);
        self.cached.clear();
        self.cached.extend(
            self.tokens
                .iter()
                .enumerate()
                .map(|(i, &t)| (pod_addr(i), t)),
        );
        &self.cached
    }
}

#[cfg(test)]
mod tests;
