//! The scripts a garbage peer follows, drawn by proptest: per connection,
//! maybe a relay to the real store first, then steps of garbage in the
//! store's protocol (or another's), then an ending.

use std::time::Duration;

use holdfast_testkit::faults::{Protocol, Script, Step, lookalikes};
use proptest::prelude::*;

/// A header of `protocol` announcing far more bytes than will come.
fn huge_length(protocol: Protocol) -> impl Strategy<Value = Vec<u8>> {
    let big = prop_oneof![Just(u32::MAX), Just(i32::MAX as u32), (1u32 << 24)..];
    (big, any::<u8>()).prop_map(move |(n, tag)| match protocol {
        Protocol::Resp => {
            format!("{}{}\r\n", ['$', '*', '%', '=', '>'][tag as usize % 5], u64::from(n) << (tag % 32)).into_bytes()
        }
        Protocol::Postgres => [&[b"RZDTEN"[tag as usize % 6]][..], &n.to_be_bytes()].concat(),
        Protocol::Mysql => vec![0xff, 0xff, 0xff, tag],
        Protocol::Http2 => {
            let mut f = vec![0xff, 0xff, 0xff, tag % 10, 0, 0, 0, 0, 1];
            f.extend_from_slice(&n.to_be_bytes());
            f
        }
        Protocol::ZooKeeper => n.to_be_bytes().to_vec(),
    })
}

/// One chunk a peer sends: a lookalike of the protocol whole, cut, with
/// bytes appended or one byte changed; a lookalike of another protocol;
/// random bytes; or a huge length.
fn chunk(protocol: Protocol) -> impl Strategy<Value = Vec<u8>> {
    let own = prop::sample::select(lookalikes(protocol));
    let all: Vec<Vec<u8>> = [Protocol::Resp, Protocol::Postgres, Protocol::Mysql, Protocol::Http2, Protocol::ZooKeeper]
        .into_iter()
        .flat_map(lookalikes)
        .collect();
    let mutated =
        (own.clone(), any::<prop::sample::Index>(), any::<u8>(), 0usize..3).prop_map(|(mut b, at, x, how)| {
            if !b.is_empty() {
                let i = at.index(b.len());
                match how {
                    0 => b.truncate(i),
                    1 => b[i] ^= x | 1,
                    _ => b.extend(std::iter::repeat_n(x, i + 1)),
                }
            }
            b
        });
    prop_oneof![
        3 => own,
        3 => mutated,
        1 => prop::sample::select(all),
        1 => prop::collection::vec(any::<u8>(), 0..64),
        2 => huge_length(protocol),
    ]
}

/// A script: steps (mostly read-then-reply, as a server does), then an
/// ending: close, reset, silence, or none (the peer closes).
fn script(protocol: Protocol) -> impl Strategy<Value = Script> {
    let step = prop_oneof![
        4 => chunk(protocol).prop_map(|c| vec![Step::Read, Step::Send(c)]),
        2 => chunk(protocol).prop_map(|c| vec![Step::Send(c)]),
        1 => (0u64..300).prop_map(|ms| vec![Step::Pause(Duration::from_millis(ms))]),
        1 => (chunk(protocol), 1usize..(4 << 20)).prop_map(|(pattern, bytes)| vec![Step::Flood { pattern, bytes }]),
        1 => Just(vec![Step::Read]),
    ];
    let ending = prop_oneof![
        1 => Just(vec![Step::Close]),
        1 => Just(vec![Step::Reset]),
        2 => Just(vec![Step::Silence]),
        1 => Just(vec![]),
    ];
    // A relay first (ignored by a peer without a store behind it): the
    // garbage comes after the handshake, or in the middle of a call.
    let relay = prop_oneof![1 => Just(vec![]), 2 => (0u32..12).prop_map(|n| vec![Step::Relay(n)])];
    (relay, prop::collection::vec(step, 0..5), ending).prop_map(|(relay, steps, end)| {
        Script::new(relay.into_iter().chain(steps.into_iter().flatten()).chain(end).collect())
    })
}

/// Scripts for a peer's successive connections (a client may open several).
pub fn scripts(protocol: Protocol) -> impl Strategy<Value = Vec<Script>> {
    prop::collection::vec(script(protocol), 1..4)
}
