//! The bench crate's tests, in one binary (each binary is a full build and
//! link): the smoke run on SQLite and each store's raw floor against a real
//! server, each module behind its store's feature.

/// The checks every raw floor must pass (each store's module uses some).
mod floor_checks;

#[path = "etcd_floor.rs"]
mod etcd_floor;
#[path = "mysql_floor.rs"]
mod mysql_floor;
#[path = "postgres_floor.rs"]
mod postgres_floor;
#[path = "redis_floor.rs"]
mod redis_floor;
#[path = "smoke.rs"]
mod smoke;
#[path = "zookeeper_floor.rs"]
mod zookeeper_floor;
