//! Model 12: how a ZooKeeper waiter learns that its new queue node is first
//! in line (issue 33: the uncontended ZooKeeper cycle in two requests, not
//! three).
//!
//! One lock: a CONTAINER parent whose children are the queue, each an
//! EPHEMERAL_SEQUENTIAL node numbered with the parent's child version
//! (`cversion`, which counts creates and deletes of children) and fenced
//! with its creation zxid. The ensemble applies one transaction at a time,
//! each with the next zxid. The server's container check removes the
//! parent once it is empty and has had children; a client whose create finds
//! no parent creates it (a new incarnation, child version 0) and joins.
//! Clients A, B, C join, wait, hold and delete their nodes in any order;
//! a waiter may be cancelled (its node deleted), and an admin's
//! `force_release` may delete the head once. A waiter that is not first
//! checks again whenever it likes (its watch on the node before it, or a
//! listing); it holds once its node is the head. What the variants change
//! is how a new node learns that it is first:
//!
//! - `Shipped`: the create and an empty `setData` of the parent are one
//!   `multi`; the `setData`'s reply is the parent's stat inside that
//!   transaction, so `numChildren == 1` says the new node is the only child.
//!   Otherwise the queue is listed.
//! - `Listed`: the design before: the queue is listed behind the create
//!   (pipelined on the session; other clients' transactions may come
//!   between the two).
//! - `SeqFromMemory` (rejected): no listing when the new node's sequence
//!   number is the client's last node's plus 2 (that node alone at its
//!   create, then deleted by the client: nothing else changed the queue).
//! - `StatAfterCreate` (rejected): the parent's stat read right behind the
//!   create (an `exists` pipelined like the listing), `numChildren == 1`.

mod state;

pub use state::{Client, JoinState, Node, Parent, client_name};

use std::fmt;

use stateright::{Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JoinVariant {
    /// Shipped: the child count from the parent's stat in the create's transaction.
    Shipped,
    /// The design before: a listing behind every create.
    Listed,
    /// Rejected: first in line when the sequence number is the last own one plus 2.
    SeqFromMemory,
    /// Rejected: the child count from a stat read after the create.
    StatAfterCreate,
}

/// Name of the mutual-exclusion property.
pub const MUTUAL_EXCLUSION: &str = "no two clients hold while both their nodes exist";
/// Name of the head property.
pub const GRANT_AT_HEAD: &str = "a client counts itself the holder only while its node is the head";
/// Name of the fence-order property.
pub const FENCES_INCREASE: &str = "each grant's fence is above every earlier grant's";
/// Reachability: a grant decided from the join's reply alone.
pub const GRANT_FROM_REPLY: &str = "a grant is decided from the join's reply, without a listing";
/// Reachability: a grant in a recreated parent.
pub const GRANT_AFTER_RECREATE: &str = "a lock is granted in a recreated parent";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct JoinModel {
    /// Which design.
    pub variant: JoinVariant,
    /// Acquisitions per client: A, B, C.
    pub acquisitions: [u8; 3],
}

impl JoinModel {
    /// A makes two acquisitions, B and C one each.
    pub fn new(variant: JoinVariant) -> Self {
        JoinModel { variant, acquisitions: [2, 1, 1] }
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JoinAction {
    /// An idle client starts an acquisition.
    Begin(u8),
    /// A joining client finds no parent and creates it.
    MakeParent(u8),
    /// A joining client's create (and, `Shipped`, the parent's stat in the
    /// same transaction) is applied and answered.
    Join(u8),
    /// `StatAfterCreate`: the parent's stat read behind the create is answered.
    Stat(u8),
    /// A waiter looks at the queue again (listing, or its watch fired).
    Check(u8),
    /// A holder deletes its node.
    Release(u8),
    /// A joined or waiting client is cancelled: its node is deleted.
    Cancel(u8),
    /// An admin deletes the head node (`force_release`).
    ForceRelease,
    /// The server's container check removes the empty parent.
    Reap,
}

impl fmt::Display for JoinAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Begin(c) => write!(f, "{} starts an acquisition", client_name(*c)),
            Self::MakeParent(c) => write!(f, "{} finds no parent and creates it", client_name(*c)),
            Self::Join(c) => write!(f, "{} creates its node", client_name(*c)),
            Self::Stat(c) => write!(f, "{} reads the parent's stat", client_name(*c)),
            Self::Check(c) => write!(f, "{} looks at the queue", client_name(*c)),
            Self::Release(c) => write!(f, "{} releases", client_name(*c)),
            Self::Cancel(c) => write!(f, "{} is cancelled", client_name(*c)),
            Self::ForceRelease => write!(f, "an admin force-releases the head"),
            Self::Reap => write!(f, "the container check removes the empty parent"),
        }
    }
}

impl JoinModel {
    /// Client `c` counts itself the holder of its node `seq` (fence `czxid`).
    fn grant(s: &mut JoinState, c: u8, seq: u8, czxid: u8, from_reply: bool) {
        let parent = s.parent.as_ref();
        let mine = parent.and_then(|p| p.node_of(c)).filter(|n| n.seq == seq);
        if mine.is_none() || parent.and_then(Parent::head) != mine {
            s.granted_off_head = true;
        }
        if s.top_fence > 0 && czxid <= s.top_fence {
            s.fence_went_back = true;
        }
        s.top_fence = s.top_fence.max(czxid);
        s.granted_from_reply |= from_reply;
        s.granted_after_recreate |= s.incarnations > 1;
        s.clients[c as usize] = Client::Holding { seq, fence: czxid };
    }

    /// Deletes client `c`'s node `seq` if it is there.
    fn delete(s: &mut JoinState, c: u8, seq: u8) {
        let Some(p) = s.parent.as_mut() else { return };
        let before = p.children.len();
        p.children.retain(|n| !(n.client == c && n.seq == seq));
        if p.children.len() < before {
            p.cversion += 1;
            s.zxid += 1;
        }
    }

    fn join(&self, s: &mut JoinState, c: u8) {
        let Some(p) = s.parent.as_mut() else { return };
        s.zxid += 1;
        let node = Node { client: c, seq: p.cversion, czxid: s.zxid };
        p.cversion += 1;
        p.children.push(node);
        let only_child = p.children.len() == 1;
        s.alone[c as usize] = only_child;
        let (seq, czxid) = (node.seq, node.czxid);
        match self.variant {
            JoinVariant::Shipped if only_child => Self::grant(s, c, seq, czxid, true),
            JoinVariant::SeqFromMemory if s.memory[c as usize].is_some_and(|m| seq == m + 2) => {
                Self::grant(s, c, seq, czxid, true)
            }
            JoinVariant::StatAfterCreate => s.clients[c as usize] = Client::Joined { seq, czxid },
            _ => s.clients[c as usize] = Client::Waiting { seq, czxid },
        }
        s.memory[c as usize] = None;
    }

    /// A waiter's look at the queue: the head holds; a vanished node ends
    /// the acquisition (the next call would queue anew).
    fn check(s: &mut JoinState, c: u8, seq: u8, czxid: u8) -> bool {
        let parent = s.parent.as_ref();
        match parent.and_then(|p| p.node_of(c)).filter(|n| n.seq == seq) {
            None => s.clients[c as usize] = Client::Idle,
            Some(mine) if parent.and_then(Parent::head) == Some(mine) => Self::grant(s, c, seq, czxid, false),
            Some(_) => return false,
        }
        true
    }
}

impl Model for JoinModel {
    type State = JoinState;
    type Action = JoinAction;

    fn init_states(&self) -> Vec<JoinState> {
        vec![JoinState {
            parent: None,
            incarnations: 0,
            zxid: 0,
            clients: vec![Client::Idle; 3],
            used: vec![0; 3],
            memory: vec![None; 3],
            alone: vec![false; 3],
            forced: false,
            top_fence: 0,
            fence_went_back: false,
            granted_off_head: false,
            granted_from_reply: false,
            granted_after_recreate: false,
        }]
    }

    fn actions(&self, s: &JoinState, actions: &mut Vec<JoinAction>) {
        for c in 0..3u8 {
            match s.clients[c as usize] {
                Client::Idle if s.used[c as usize] < self.acquisitions[c as usize] => {
                    actions.push(JoinAction::Begin(c))
                }
                Client::Joining if s.parent.is_none() => actions.push(JoinAction::MakeParent(c)),
                Client::Joining => actions.push(JoinAction::Join(c)),
                Client::Joined { .. } => actions.extend([JoinAction::Stat(c), JoinAction::Cancel(c)]),
                Client::Waiting { .. } => actions.extend([JoinAction::Check(c), JoinAction::Cancel(c)]),
                Client::Holding { .. } => actions.push(JoinAction::Release(c)),
                Client::Idle => {}
            }
        }
        match &s.parent {
            Some(p) if p.children.is_empty() && p.cversion > 0 => actions.push(JoinAction::Reap),
            Some(p) if !s.forced && !p.children.is_empty() => actions.push(JoinAction::ForceRelease),
            _ => {}
        }
    }

    fn next_state(&self, s: &JoinState, action: JoinAction) -> Option<JoinState> {
        let mut n = s.clone();
        match action {
            JoinAction::Begin(c) => {
                n.used[c as usize] += 1;
                n.clients[c as usize] = Client::Joining;
            }
            JoinAction::MakeParent(_) => {
                n.incarnations += 1;
                n.zxid += 1;
                n.parent = Some(Parent { incarnation: n.incarnations, cversion: 0, children: Vec::new() });
            }
            JoinAction::Join(c) => self.join(&mut n, c),
            JoinAction::Stat(c) => {
                let Client::Joined { seq, czxid } = n.clients[c as usize] else { return None };
                if n.parent.as_ref().is_some_and(|p| p.children.len() == 1) {
                    Self::grant(&mut n, c, seq, czxid, true);
                } else {
                    n.clients[c as usize] = Client::Waiting { seq, czxid };
                }
            }
            JoinAction::Check(c) => {
                let Client::Waiting { seq, czxid } = n.clients[c as usize] else { return None };
                if !Self::check(&mut n, c, seq, czxid) {
                    return None;
                }
            }
            JoinAction::Release(c) => {
                let Client::Holding { seq, .. } = n.clients[c as usize] else { return None };
                Self::delete(&mut n, c, seq);
                if self.variant == JoinVariant::SeqFromMemory && n.alone[c as usize] {
                    n.memory[c as usize] = Some(seq);
                }
                n.clients[c as usize] = Client::Idle;
            }
            JoinAction::Cancel(c) => {
                let (Client::Joined { seq, .. } | Client::Waiting { seq, .. }) = n.clients[c as usize] else {
                    return None;
                };
                Self::delete(&mut n, c, seq);
                n.clients[c as usize] = Client::Idle;
            }
            JoinAction::ForceRelease => {
                let head = n.parent.as_ref().and_then(Parent::head)?;
                Self::delete(&mut n, head.client, head.seq);
                n.forced = true;
            }
            JoinAction::Reap => {
                n.parent = None;
                n.zxid += 1;
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(MUTUAL_EXCLUSION, |_, s: &JoinState| !s.two_holders()),
            Property::always(GRANT_AT_HEAD, |_, s: &JoinState| !s.granted_off_head),
            Property::always(FENCES_INCREASE, |_, s: &JoinState| !s.fence_went_back),
            Property::sometimes(GRANT_FROM_REPLY, |_, s: &JoinState| s.granted_from_reply),
            Property::sometimes(GRANT_AFTER_RECREATE, |_, s: &JoinState| s.granted_after_recreate),
        ]
    }
}
