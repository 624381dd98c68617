//! A counterexample as readable steps, for test output and the README.

use std::fmt::Display;

use stateright::Path;

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
