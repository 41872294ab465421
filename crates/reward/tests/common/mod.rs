//! Shared by the reward integration tests.
#![allow(dead_code)]

pub mod forgers;
