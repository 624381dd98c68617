//! The spans of acquire, wait, renew and release carry key, store, fence and
//! outcome, and a store call's span (and any span the store makes inside
//! it) nests under its caller's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use holdfast::backend::{AcquireRequest, Backend, Grant, LockStatus, RenewRequest};
use holdfast::{Capabilities, Client, ClientOptions, LockKey, OwnerToken};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One span as recorded: its name, its ancestors' names (nearest first)
/// and its fields as text.
#[derive(Debug, Clone, Default)]
pub struct SpanSeen {
    pub name: String,
    pub ancestors: Vec<String>,
    pub fields: Vec<(String, String)>,
}

impl SpanSeen {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Records every span with its ancestry, every field recorded on it later,
/// and every event's text, at every level.
#[derive(Clone, Default)]
pub struct Recorder {
    pub spans: Arc<Mutex<Vec<SpanSeen>>>,
    pub events: Arc<Mutex<Vec<String>>>,
}

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

/// Index of a span in [`Recorder::spans`], kept in the span's extensions.
struct Slot(usize);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let ancestors = span.scope().skip(1).map(|s| s.name().to_owned()).collect();
        let mut fields = Vec::new();
        attrs.record(&mut Fields(&mut fields));
        let mut spans = self.spans.lock().unwrap();
        spans.push(SpanSeen { name: attrs.metadata().name().to_owned(), ancestors, fields });
        span.extensions_mut().insert(Slot(spans.len() - 1));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let Some(slot) = span.extensions().get::<Slot>().map(|s| s.0) else { return };
        values.record(&mut Fields(&mut self.spans.lock().unwrap()[slot].fields));
    }

    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        self.events.lock().unwrap().push(format!("{} {fields:?}", event.metadata().target()));
    }
}

/// Makes `subscriber` the current thread's until the returned value is
/// dropped, and makes sure it sees every span and event. tracing caches
/// whether a callsite is wanted process-wide, the first time any thread
/// reaches it: while one dispatcher is registered it asks only the reaching
/// thread's own, so a test running beside this one without a subscriber
/// could cache "never" for the library's `release` span, and a recorder then
/// missed it (seen once, in a parallel run); a test that asserts a log line
/// is absent would pass without looking. A second registered dispatcher
/// that wants everything makes every later registration ask all of them;
/// rebuilding the cache undoes any "never" cached before.
pub fn install(subscriber: impl tracing::Subscriber + Send + Sync + 'static) -> Installed {
    let anchor = tracing::Dispatch::new(tracing_subscriber::registry());
    let default = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    Installed { _default: default, _anchor: anchor }
}

/// A subscriber installed as this thread's (see [`install`]).
pub struct Installed {
    _default: tracing::subscriber::DefaultGuard,
    _anchor: tracing::Dispatch,
}

impl Recorder {
    /// A subscriber with this recorder at every level, for `set_default`.
    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        tracing_subscriber::registry().with(self.clone())
    }

    /// Makes this recorder the current thread's subscriber until the
    /// returned value is dropped (see [`install`]).
    pub fn install(&self) -> Installed {
        install(self.subscriber())
    }

    /// Everything recorded, as one text to search.
    #[allow(dead_code, reason = "used by the secrets tests of some stores only")]
    pub fn text(&self) -> String {
        format!("{:?}\n{:?}", self.spans.lock().unwrap(), self.events.lock().unwrap())
    }

    fn named(&self, name: &str) -> Vec<SpanSeen> {
        self.spans.lock().unwrap().iter().filter(|s| s.name == name).cloned().collect()
    }
}

/// A span reached first on a thread without a subscriber, then on the
/// recorder's thread: the recorder sees it (tracing cached "never" for it
/// before [`install`] registered a second dispatcher).
pub fn recorder_sees_spans_first_reached_elsewhere() {
    fn reach() {
        tracing::debug_span!("reached_first_elsewhere").in_scope(|| {});
    }
    let rec = Recorder::default();
    let _installed = rec.install();
    std::thread::spawn(reach).join().expect("thread");
    reach();
    assert_eq!(rec.named("reached_first_elsewhere").len(), 1);
}

/// A store that makes a span of its own inside every call, as a store
/// client library may.
#[derive(Debug)]
struct SpanningStore(Arc<dyn Backend>);

#[async_trait]
impl Backend for SpanningStore {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> holdfast::Result<Option<Grant>> {
        tracing::trace_span!("inside_store", op = "try_acquire").in_scope(|| {});
        self.0.try_acquire(req).await
    }
    async fn acquire(&self, req: &AcquireRequest) -> holdfast::Result<Grant> {
        tracing::trace_span!("inside_store", op = "acquire").in_scope(|| {});
        self.0.acquire(req).await
    }
    async fn release(&self, key: &LockKey, token: OwnerToken) -> holdfast::Result<bool> {
        tracing::trace_span!("inside_store", op = "release").in_scope(|| {});
        self.0.release(key, token).await
    }
    async fn renew(&self, leases: &[RenewRequest]) -> holdfast::Result<Vec<bool>> {
        tracing::trace_span!("inside_store", op = "renew").in_scope(|| {});
        self.0.renew(leases).await
    }
    async fn status(&self, key: &LockKey) -> holdfast::Result<LockStatus> {
        self.0.status(key).await
    }
}

/// Acquire (waiting and not), renew, busy and release on `url` through a
/// store that makes spans of its own: the spans nest and carry their fields.
pub fn spans_nest_and_carry_fields(url: &str, store: &'static str) {
    let rec = Recorder::default();
    let _installed = rec.install();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let fence = rt.block_on(async {
        let backend: Arc<dyn Backend> = Arc::new(SpanningStore(holdfast::stores::connect(url).await.expect("connect")));
        let client = Client::with_backend(backend, ClientOptions::default());
        let g = client
            .mutex("sp:k")
            .ttl(Duration::from_millis(900))
            .renew_every(Duration::from_millis(100))
            .acquire()
            .await
            .expect("acquire");
        // Two renewals done (every 100 ms on an idle machine; a loaded one
        // may take longer, and a fixed sleep then saw fewer).
        let renewed = || rec.named("renew").iter().filter(|r| r.field("outcome").is_some()).count();
        let started = std::time::Instant::now();
        while renewed() < 2 {
            assert!(started.elapsed() < Duration::from_secs(20), "no two renewals in 20 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(client.mutex("sp:k").try_acquire().await.expect("try").is_none());
        let fence = g.fence();
        g.release().await.expect("release");
        fence
    });
    let fence = fence.to_string();
    let acquires = rec.named("acquire");
    assert_eq!(acquires.len(), 2, "{acquires:#?}");
    for (a, outcome) in acquires.iter().zip(["granted", "busy"]) {
        assert_eq!(a.field("key"), Some("sp:k"));
        assert_eq!(a.field("store"), Some(store));
        assert_eq!(a.field("outcome"), Some(outcome), "{a:?}");
    }
    assert_eq!(acquires[0].field("fence"), Some(fence.as_str()));
    let waits = rec.named("wait");
    assert_eq!(waits.len(), 1);
    assert_eq!(waits[0].ancestors, ["acquire"]);
    let renews = rec.named("renew");
    // Renewals may still be in flight when the guard is released and the
    // runtime stops (one, or up to four once renewal falls behind on a
    // loaded machine): their spans have no outcome (and maybe no store call)
    // yet. Every other one renewed.
    let done = renews.iter().filter(|r| r.field("outcome").is_some()).count();
    assert!(done >= 2 && renews.len() - done <= 4, "{renews:#?}");
    for r in &renews {
        assert_eq!((r.field("key"), r.field("store")), (Some("sp:k"), Some(store)));
        assert_eq!(r.field("fence"), Some(fence.as_str()));
        assert!(matches!(r.field("outcome"), None | Some("renewed")), "{r:?}");
    }
    let releases = rec.named("release");
    assert_eq!(releases.len(), 1);
    let r = &releases[0];
    assert_eq!(
        (r.field("key"), r.field("fence"), r.field("outcome")),
        (Some("sp:k"), Some(fence.as_str()), Some("released"))
    );
    // Every store call nests under its caller, and the store's own span under it.
    let inside = rec.named("inside_store");
    let chain = |op: &str| -> Vec<Vec<String>> {
        inside.iter().filter(|s| s.field("op") == Some(op)).map(|s| s.ancestors.clone()).collect()
    };
    assert_eq!(chain("acquire"), [["store", "wait", "acquire"]]);
    assert_eq!(chain("try_acquire"), [["store", "acquire"]]);
    assert_eq!(chain("release"), [["store", "release"]]);
    let renew_chains = chain("renew");
    assert!((done..=renews.len()).contains(&renew_chains.len()), "{renew_chains:?} for {renews:#?}");
    assert!(renew_chains.iter().all(|c| c == &["store", "renew"]), "{renew_chains:?}");
}
