//! The one list of the connectors and transforms lockgate ships: what a job file can
//! name. The command line hands it to the job-file reader ([`crate::config::load`]); a
//! program of its own adds its connectors to it.
//!
//! A new connector is a folder under `connectors/` and one line here.

use crate::connector::Registry;
use crate::transforms::{debezium, fields, filter, jq, set_key, time, SmtConfig as _, SmtSection};

/// Every built-in source, transform and sink, in the order messages list them.
pub fn registry() -> Registry {
    Registry::empty()
        .with_source::<crate::connectors::sequence::SequenceSection>(
            crate::connectors::sequence::KIND,
        )
        .with_source::<crate::connectors::kafka::KafkaSection>(crate::connectors::kafka::KIND)
        .with_source::<crate::connectors::postgres_cdc::CdcSection>(
            crate::connectors::postgres_cdc::KIND,
        )
        .with_transform::<crate::operators::rolling_sum::RollingSumSection>(
            crate::operators::rolling_sum::KIND,
        )
        .with_transform::<crate::operators::window::WindowSection>(crate::operators::window::KIND)
        .with_transform::<SmtSection<fields::InsertField>>(fields::InsertField::KIND)
        .with_transform::<SmtSection<fields::ReplaceField>>(fields::ReplaceField::KIND)
        .with_transform::<SmtSection<fields::ExtractField>>(fields::ExtractField::KIND)
        .with_transform::<SmtSection<set_key::SetKey>>(set_key::SetKey::KIND)
        .with_transform::<SmtSection<fields::Cast>>(fields::Cast::KIND)
        .with_transform::<SmtSection<time::TimestampConverter>>(time::TimestampConverter::KIND)
        .with_transform::<SmtSection<fields::Flatten>>(fields::Flatten::KIND)
        .with_transform::<SmtSection<fields::MaskField>>(fields::MaskField::KIND)
        .with_transform::<SmtSection<filter::FilterConfig>>(filter::FilterConfig::KIND)
        .with_transform::<SmtSection<jq::JqConfig>>(jq::JqConfig::KIND)
        .with_transform::<SmtSection<debezium::DebeziumConfig>>(debezium::DebeziumConfig::KIND)
        .with_sink::<crate::connectors::file_sink::FileSection>(crate::connectors::file_sink::KIND)
        .with_sink::<crate::connectors::elasticsearch::EsSection>(
            crate::connectors::elasticsearch::KIND,
        )
        .with_sink::<crate::connectors::kafka::KafkaSinkSection>(crate::connectors::kafka::KIND)
        .with_sink::<crate::connectors::postgres::PgSection>(crate::connectors::postgres::KIND)
        .with_sink::<crate::connectors::iceberg::IcebergSection>(crate::connectors::iceberg::KIND)
}
