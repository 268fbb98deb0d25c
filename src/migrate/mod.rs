//! `lockgate migrate kafka-connect`: a Kafka Connect Elasticsearch sink's configuration
//! ([`input`]) translated ([`translate`], with the chain of transforms in
//! [`transforms`]) into a job file ([`job_file`]) by one table ([`table`]), which the
//! README's "Coming from Kafka Connect" shows.

pub mod input;
pub mod job_file;
pub mod left_out;
pub mod settings;
pub mod table;
pub mod transforms;
pub mod translate;

pub use input::{parse, ConnectorConfig};
pub use translate::{translate, Options, Translation};
