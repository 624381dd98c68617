//! A lossy, reordering, non-duplicating network.
//!
//! In-flight messages are a multiset kept sorted, so two states holding the
//! same messages in a different sending order are one state. Two equal
//! messages in flight are two messages (both may be delivered). The checker may
//! deliver any in-flight message at any step, or never: a message that is never
//! delivered is a lost one, and for the safety properties checked here that is
//! exactly what loss means, so no separate "drop" action is needed (it would only
//! add states). Reordering and arbitrary delay follow from the same freedom.

/// The set of messages in flight.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Network<M> {
    in_flight: Vec<M>,
}

impl<M> Default for Network<M> {
    fn default() -> Self {
        Self { in_flight: Vec::new() }
    }
}

impl<M: Ord + Clone> Network<M> {
    /// Puts a message in flight.
    pub fn send(&mut self, message: M) {
        let position = self.in_flight.partition_point(|sent| *sent <= message);
        self.in_flight.insert(position, message);
    }

    /// Takes a message out of the network (it was delivered); false if it was
    /// not in flight.
    pub fn take(&mut self, message: &M) -> bool {
        match self.in_flight.binary_search(message) {
            Ok(position) => {
                self.in_flight.remove(position);
                true
            }
            Err(_) => false,
        }
    }

    /// Drops every message for which `keep` is false (used to forget replies
    /// that their receiver would ignore anyway).
    pub fn retain(&mut self, keep: impl FnMut(&M) -> bool) {
        self.in_flight.retain(keep);
    }

    /// Rewrites every message with `rewrite` (used to forget what no node can
    /// act on any more), keeping the canonical order.
    pub fn rewrite(&mut self, rewrite: impl FnMut(M) -> M) {
        let mut rewritten: Vec<M> = self.in_flight.drain(..).map(rewrite).collect();
        rewritten.sort();
        self.in_flight = rewritten;
    }

    /// The messages in flight, in their canonical order.
    pub fn iter(&self) -> impl Iterator<Item = &M> {
        self.in_flight.iter()
    }

    /// The distinct messages in flight (delivering either of two equal
    /// messages leads to the same state, so the checker needs one action).
    pub fn distinct(&self) -> impl Iterator<Item = &M> {
        let mut previous: Option<&M> = None;
        self.in_flight.iter().filter(move |message| {
            let new = previous != Some(*message);
            previous = Some(*message);
            new
        })
    }

    /// How many messages are in flight.
    pub fn len(&self) -> usize {
        self.in_flight.len()
    }

    /// True if nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
    }
}
