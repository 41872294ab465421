//! (module in progress this session: see lib.rs for its role)
