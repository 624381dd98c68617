//! The `holdfast` command.

fn main() {}
