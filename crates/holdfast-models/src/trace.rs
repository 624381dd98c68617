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
/// breadth-first, so that each counterexample is a shortest one, until every
/// property in `expected` is violated; prints the state count and each
/// counterexample as a concrete run of `model`, and panics if one is missing
/// or does not replay. `label` names the model in the output.
pub fn assert_shortest_counterexamples<M>(
    model: &M,
    searched: M,
    representative: fn(&M::State) -> M::State,
    label: &str,
    expected: &[&'static str],
) where
    M: Model + Send + Sync + 'static,
    M::State: Display + Clone + PartialEq + Hash + Debug + Send + Sync,
    M::Action: Display + Clone + PartialEq + Debug + Send + Sync,
{
    let started = Instant::now();
    let checker = searched
        .checker()
        .finish_when(HasDiscoveries::AllOf(expected.iter().copied().collect::<BTreeSet<_>>()))
        .spawn_bfs()
        .join();
    println!("{label}: searched {} states in {:.1?}", checker.unique_state_count(), started.elapsed());
    for property in expected {
        match checker.discovery(property).map(|path| concrete_trace(model, &path, representative)) {
            Some(Some(trace)) => println!("{label}: counterexample to \"{property}\":\n{trace}"),
            Some(None) => panic!("{label}: the counterexample does not replay"),
            None => panic!("{label}: no counterexample to {property}"),
        }
    }
}
