//! The gate row of shared leases: a lease row whose token is [`GATE`], so
//! that the mutex statements see a key that shares hold as held without
//! reading the shares table (see `shares`). Only `shares` writes it; the
//! statements beside it tell it from an exclusive holder with these.

/// The token of a key's lease row while shares hold the key. Only `shares`
/// writes it; the other files ask [`is_gate`] and [`gate_sql`].
pub(super) const GATE: [u8; 16] = [0; 16];

/// [`GATE`] as a SQL literal.
pub(super) const GATE_LITERAL: &str = "'\\x00000000000000000000000000000000'::bytea";

/// Whether a lease row's token is the gate of shares rather than an
/// exclusive holder.
pub(super) fn is_gate(token: &[u8]) -> bool {
    token == GATE
}

/// A SQL condition that the lease row's token column `column` is (`is`
/// true) or is not the gate of shares, for the statements beside this
/// module that tell an exclusive holder from the gate.
pub(super) fn gate_sql(column: &str, is: bool) -> String {
    format!("{column} {} {GATE_LITERAL}", if is { "=" } else { "<>" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_conditions_name_the_gate_token() {
        let hex: String = GATE.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(gate_sql("t.token", true), format!("t.token = '\\x{hex}'::bytea"));
        assert_eq!(gate_sql("token", false), format!("token <> '\\x{hex}'::bytea"));
        assert!(is_gate(&GATE) && !is_gate(&[1; 16]));
    }
}
