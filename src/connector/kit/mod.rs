//! Kits a sink is built from, so that it gets lockgate's guarantees without copying
//! another sink's machinery.
