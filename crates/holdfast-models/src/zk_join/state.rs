//! What the join model remembers: the lock's container parent (if it
//! exists), each client's view, and what the properties check.

use std::fmt;

/// A queue node: its client, its sequence number (the parent's child
/// version when it was created) and its creation zxid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    /// The client that created it (one node per client at a time here).
    pub client: u8,
    /// The sequence number ZooKeeper gave it.
    pub seq: u8,
    /// The zxid of the transaction that created it.
    pub czxid: u8,
}

/// The lock's container parent, one incarnation of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Parent {
    /// Which incarnation (1 for the first create of the parent).
    pub incarnation: u8,
    /// The child version: creates and deletes of children so far; the
    /// next sequence number.
    pub cversion: u8,
    /// The queue nodes, in creation order.
    pub children: Vec<Node>,
}

impl Parent {
    /// The head of the queue: the node with the lowest sequence number.
    pub fn head(&self) -> Option<Node> {
        self.children.iter().min_by_key(|n| n.seq).copied()
    }

    /// The node of `client`, if it has one.
    pub fn node_of(&self, client: u8) -> Option<Node> {
        self.children.iter().find(|n| n.client == client).copied()
    }
}

/// Where a client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    /// Holds nothing; may start an acquisition while it has some left.
    Idle,
    /// Wants to join the queue: its next step creates its node (or, the
    /// parent being gone, the parent).
    Joining,
    /// Its node `seq` exists; it has not yet read whether it is first
    /// (`StatAfterCreate`: the parent's stat is still to be read).
    Joined {
        /// Its node's sequence number.
        seq: u8,
        /// Its node's creation zxid, from the create's reply.
        czxid: u8,
    },
    /// Not first at its last look; it checks again (a watch fired, or the
    /// queue listing comes).
    Waiting {
        /// Its node's sequence number.
        seq: u8,
        /// Its node's creation zxid, from the create's reply.
        czxid: u8,
    },
    /// Counts itself the holder, with the fence it was given.
    Holding {
        /// Its node's sequence number.
        seq: u8,
        /// The grant's fence (its node's creation zxid).
        fence: u8,
    },
}

/// The whole state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JoinState {
    /// The lock's parent; `None` before its first create and after the
    /// server's container check removed it.
    pub parent: Option<Parent>,
    /// Incarnations of the parent created so far.
    pub incarnations: u8,
    /// The ensemble's last zxid (one per transaction).
    pub zxid: u8,
    /// Each client's view.
    pub clients: Vec<Client>,
    /// Acquisitions each client has started.
    pub used: Vec<u8>,
    /// `SeqFromMemory`: the sequence number of the client's last node, kept
    /// when that node was alone in the queue at its create and the client
    /// deleted it itself.
    pub memory: Vec<Option<u8>>,
    /// `SeqFromMemory`: the client's current node was the only child when
    /// it was created.
    pub alone: Vec<bool>,
    /// An admin's `force_release` has deleted a head node.
    pub forced: bool,
    /// The highest fence granted so far.
    pub top_fence: u8,
    /// Some grant's fence was not above every earlier one.
    pub fence_went_back: bool,
    /// Some client counted itself the holder while its node was not the
    /// head of the queue (or was gone).
    pub granted_off_head: bool,
    /// Some grant was decided from the join's own reply (no listing).
    pub granted_from_reply: bool,
    /// Some grant was made in a recreated parent.
    pub granted_after_recreate: bool,
}

impl JoinState {
    /// Two clients count themselves holders while both their nodes exist.
    pub fn two_holders(&self) -> bool {
        let live = |c: usize| {
            matches!(self.clients[c], Client::Holding { seq, .. }
                if self.parent.as_ref().and_then(|p| p.node_of(c as u8)).is_some_and(|n| n.seq == seq))
        };
        (0..self.clients.len()).filter(|&c| live(c)).count() > 1
    }
}

/// A client's name in traces: A, B, C.
pub fn client_name(c: u8) -> char {
    (b'A' + c) as char
}

impl fmt::Display for JoinState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.parent {
            None => write!(f, "no parent")?,
            Some(p) => {
                write!(f, "parent #{} cversion {} [", p.incarnation, p.cversion)?;
                for (i, n) in p.children.iter().enumerate() {
                    let sep = if i == 0 { "" } else { " " };
                    write!(f, "{sep}{}:{} z{}", client_name(n.client), n.seq, n.czxid)?;
                }
                write!(f, "]")?;
            }
        }
        write!(f, "; zxid {};", self.zxid)?;
        for (c, client) in self.clients.iter().enumerate() {
            let name = client_name(c as u8);
            match client {
                Client::Idle => write!(f, " {name} idle")?,
                Client::Joining => write!(f, " {name} joining")?,
                Client::Joined { seq, .. } => write!(f, " {name} joined {seq}")?,
                Client::Waiting { seq, .. } => write!(f, " {name} waits {seq}")?,
                Client::Holding { seq, fence } => write!(f, " {name} HOLDS {seq} (fence {fence})")?,
            }
            if let Some(m) = self.memory[c] {
                write!(f, " (remembers {m})")?;
            }
            write!(f, ",")?;
        }
        Ok(())
    }
}
