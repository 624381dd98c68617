//! A counterexample as readable steps, for test output and the README.

use std::collections::BTreeSet;
use std::fmt::{Debug, Display};
use std::hash::Hash;
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path};

/// Renders a path as numbered steps: each action, then the state it led to.
pub fn readable_trace<S: Display + Clone, A: Display + Clone>(path: &Path<S, A>) -> String {
    let steps = path.clone().into_vec();
    let mut text = String::new();
    let mut step_number = 0;
    let mut previous_action: Option<A> = None;
    for (state, action) in steps {
        match previous_action.take() {
            None => text.push_str(&format!("start: {state}\n")),
            Some(done) => {
                step_number += 1;
                text.push_str(&format!("{step_number:>2}. {done}\n    -> {state}\n"));
            }
        }
        previous_action = action;
    }
    text
}

/// Turns a counterexample found over symmetry representatives back into one
/// concrete run of `model` (whose successors are not renamed): each step is an
/// action of the concrete state whose successor has the next representative.
/// Returns the steps in the same readable form as [`readable_trace`], or
/// `None` if some step cannot be matched (which would be a bug in the
/// symmetry reduction).
pub fn concrete_trace<M>(
    model: &M,
    path: &Path<M::State, M::Action>,
    representative: fn(&M::State) -> M::State,
) -> Option<String>
where
    M: stateright::Model,
    M::State: Display + Clone + PartialEq,
    M::Action: Display + Clone,
{
    let mut current = model.init_states().into_iter().next()?;
    let mut text = format!("start: {current}\n");
    let mut actions = Vec::new();
    for (step_number, target) in path.clone().into_states().iter().skip(1).enumerate() {
        actions.clear();
        model.actions(&current, &mut actions);
        let (action, next) = actions.iter().find_map(|action| {
            let next = model.next_state(&current, action.clone())?;
            (representative(&next) == *target).then(|| (action.clone(), next))
        })?;
        text.push_str(&format!("{:>2}. {action}\n    -> {next}\n", step_number + 1));
        current = next;
    }
    Some(text)
}

/// Searches `searched` (a model exploring symmetry representatives)
/// breadth-first until every property in `expected` is violated; prints the
/// state count and a shortest counterexample to each as a concrete run of
/// `model`, and panics if one is missing or does not replay. `label` names
/// the model in the output.
///
/// Stateright's search keeps the last violation it meets, not the first,
/// and checks whether to stop only between blocks of states: on a space of
/// a few blocks the path it keeps can be far from the shortest. So on a
/// space of at most [`DEEPENED_UP_TO`] states each discovery is searched
/// for again with the depth raised one step at a time, which finds a
/// shortest one; on a larger space the kept path is from the block where
/// the search stopped, within a step or two of the shortest.
pub fn assert_shortest_counterexamples<M>(
    model: &M,
    searched: M,
    representative: fn(&M::State) -> M::State,
    label: &str,
    expected: &[&'static str],
) where
    M: Model + Clone + Send + Sync + 'static,
    M::State: Display + Clone + PartialEq + Hash + Debug + Send + Sync,
    M::Action: Display + Clone + PartialEq + Debug + Send + Sync,
{
    let started = Instant::now();
    let checker = searched
        .clone()
        .checker()
        .finish_when(HasDiscoveries::AllOf(expected.iter().copied().collect::<BTreeSet<_>>()))
        .spawn_bfs()
        .join();
    let states = checker.unique_state_count();
    println!("{label}: searched {states} states in {:.1?}", started.elapsed());
    for property in expected {
        let Some(found) = checker.discovery(property) else { panic!("{label}: no counterexample to {property}") };
        let path = if states <= DEEPENED_UP_TO { shortest(&searched, property, found) } else { found };
        match concrete_trace(model, &path, representative) {
            Some(trace) => println!("{label}: counterexample to \"{property}\":\n{trace}"),
            None => panic!("{label}: the counterexample does not replay"),
        }
    }
}

/// The largest state space on which counterexamples are searched for again
/// depth by depth (see [`assert_shortest_counterexamples`]).
pub const DEEPENED_UP_TO: usize = 200_000;

/// A shortest path to a violation of `property`, no longer than `found`.
fn shortest<M>(searched: &M, property: &'static str, found: Path<M::State, M::Action>) -> Path<M::State, M::Action>
where
    M: Model + Clone + Send + Sync + 'static,
    M::State: Clone + PartialEq + Hash + Debug + Send + Sync,
    M::Action: Clone + PartialEq + Debug + Send + Sync,
{
    let steps = found.clone().into_actions().len();
    shortest_counterexample(searched, property, steps + 1).unwrap_or(found)
}

/// A shortest path to a violation of `property` of at most `max_depth`
/// steps, if there is one: breadth-first searches bounded one step deeper
/// each time (see [`assert_shortest_counterexamples`] for why the
/// checker's own discovery is not enough).
pub fn shortest_counterexample<M>(
    searched: &M,
    property: &'static str,
    max_depth: usize,
) -> Option<Path<M::State, M::Action>>
where
    M: Model + Clone + Send + Sync + 'static,
    M::State: Clone + PartialEq + Hash + Debug + Send + Sync,
    M::Action: Clone + PartialEq + Debug + Send + Sync,
{
    (1..=max_depth).find_map(|depth| {
        searched
            .clone()
            .checker()
            .target_max_depth(depth)
            .finish_when(HasDiscoveries::AllOf(BTreeSet::from([property])))
            .spawn_bfs()
            .join()
            .discovery(property)
    })
}
