//! The catalog a table is in, and the table: loaded, or created from the sink's
//! schema and partition spec when it does not exist yet.

use super::schema::{partition_spec, same_partitioning, table_schema};
use super::section::{CatalogKind, IcebergConfig};
use super::storage::LakeStorageFactory;
use iceberg::table::Table;
use iceberg::{Catalog, CatalogBuilder, TableCreation};
use std::collections::HashMap;
use std::sync::Arc;

/// Connects to the configured catalog. The table's files are reached through
/// lockgate's own file access ([`super::storage`]).
pub async fn connect(cfg: &IcebergConfig) -> Result<Arc<dyn Catalog>, String> {
    let storage = Arc::new(LakeStorageFactory::new(cfg.store.as_ref()));
    let c = &cfg.catalog;
    let mut props = HashMap::new();
    if let Some(w) = &c.warehouse {
        props.insert("warehouse".to_string(), w.clone());
    }
    match &c.kind {
        CatalogKind::Sql { uri, postgres } => {
            props.insert("uri".into(), uri.clone());
            let style = match postgres {
                true => iceberg_catalog_sql::SqlBindStyle::DollarNumeric,
                false => iceberg_catalog_sql::SqlBindStyle::QMark,
            };
            let catalog = iceberg_catalog_sql::SqlCatalogBuilder::default()
                .with_storage_factory(storage)
                .sql_bind_style(style)
                .load(&c.name, props)
                .await
                .map_err(|e| format!("the SQL catalog {uri_shown}: {e}", uri_shown = shown(uri)))?;
            Ok(Arc::new(catalog))
        }
        CatalogKind::Rest { uri } => {
            props.insert("uri".into(), uri.clone());
            let catalog = iceberg_catalog_rest::RestCatalogBuilder::default()
                .with_storage_factory(storage)
                .load(&c.name, props)
                .await
                .map_err(|e| format!("the REST catalog at {}: {e}", shown(uri)))?;
            Ok(Arc::new(catalog))
        }
    }
}

/// A database URL without its password, for messages.
fn shown(uri: &str) -> String {
    match (uri.split_once("://"), uri.rfind('@')) {
        (Some((scheme, rest)), Some(_)) => {
            let (user, host) = rest.rsplit_once('@').expect("an @");
            let user = user.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}@{host}")
        }
        _ => uri.to_string(),
    }
}

/// The sink's table: loaded, or created (with its namespace) from the sink's columns
/// and `partition_by`. A table that exists must have the columns the sink writes as
/// required, and the partition spec `partition_by` names, if it names one.
pub async fn load_or_create(catalog: &dyn Catalog, cfg: &IcebergConfig) -> Result<Table, String> {
    let ident = &cfg.table;
    let schema = table_schema(&cfg.columns.schema)?;
    let exists = catalog
        .table_exists(ident)
        .await
        .map_err(|e| format!("cannot look for table {ident}: {e}"))?;
    if exists {
        let table = catalog
            .load_table(ident)
            .await
            .map_err(|e| format!("cannot load table {ident}: {e}"))?;
        let current = table.metadata().current_schema();
        for field in current.as_struct().fields() {
            if field.required && cfg.columns.schema.field_with_name(&field.name).is_err() {
                return Err(format!(
                    "table {ident} requires the column `{}`, which the sink's schema does not have",
                    field.name
                ));
            }
        }
        // A column the table lacks would be left out of every row without a word.
        for field in cfg.columns.schema.fields() {
            if current.field_by_name(field.name()).is_none() {
                return Err(format!(
                    "table {ident} has no column `{}`, which the sink's schema has: its values would be dropped (add the column to the table, or leave it out of the schema)",
                    field.name()
                ));
            }
        }
        if let Some(parts) = &cfg.partition {
            let spec = table.metadata().default_partition_spec();
            if !same_partitioning(parts, spec, current) {
                return Err(format!(
                    "table {ident} is partitioned otherwise than partition_by says ({:?})",
                    spec.fields()
                        .iter()
                        .map(|f| format!("{}: {} of field {}", f.name, f.transform, f.source_id))
                        .collect::<Vec<_>>()
                ));
            }
        }
        return Ok(table);
    }
    let namespace = ident.namespace();
    let ns_exists = catalog
        .namespace_exists(namespace)
        .await
        .map_err(|e| format!("cannot look for namespace {namespace:?}: {e}"))?;
    if !ns_exists {
        if let Err(e) = catalog.create_namespace(namespace, HashMap::new()).await {
            // Another subtask or job may have made it meanwhile.
            let made = catalog.namespace_exists(namespace).await.unwrap_or(false);
            if !made {
                return Err(format!("cannot create namespace {namespace:?}: {e}"));
            }
        }
    }
    let mut creation = TableCreation::builder()
        .name(ident.name().to_string())
        .schema(schema.clone())
        .build();
    if let Some(parts) = &cfg.partition {
        creation.partition_spec = Some(partition_spec(parts, &schema)?);
    }
    match catalog.create_table(namespace, creation).await {
        Ok(table) => {
            tracing::info!(table = %ident, "created the table");
            Ok(table)
        }
        Err(e) => match catalog.load_table(ident).await {
            Ok(table) => Ok(table),
            Err(_) => Err(format!("cannot create table {ident}: {e}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &std::path::Path, fields: &str) -> IcebergConfig {
        std::fs::write(
            dir.join("s.avsc"),
            format!(r#"{{"type":"record","name":"o","fields":[{fields}]}}"#),
        )
        .unwrap();
        let section: super::super::IcebergSection = toml::from_str(
            r#"
            table = "shop.orders"
            schema_file = "s.avsc"
            catalog = { type = "sql", uri = "sqlite:///c.db", warehouse = "wh" }
            "#,
        )
        .unwrap();
        section.config(&|p: &std::path::Path| dir.join(p)).unwrap()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_table_without_a_column_of_the_sink_s_schema_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let id = r#"{"name":"id","type":"long"}"#;
        let email = r#"{"name":"email","type":["null","string"]}"#;
        let cfg = config(tmp.path(), id);
        let catalog = connect(&cfg).await.unwrap();
        load_or_create(catalog.as_ref(), &cfg).await.unwrap();
        load_or_create(catalog.as_ref(), &cfg).await.unwrap();
        let wider = config(tmp.path(), &format!("{id},{email}"));
        let e = load_or_create(catalog.as_ref(), &wider).await.unwrap_err();
        assert!(e.contains("no column `email`"), "{e}");
        // The other way round, a column the sink leaves out is the table's null.
        let tmp = tempfile::tempdir().unwrap();
        let wide = config(tmp.path(), &format!("{id},{email}"));
        let catalog = connect(&wide).await.unwrap();
        load_or_create(catalog.as_ref(), &wide).await.unwrap();
        let narrow = config(tmp.path(), id);
        load_or_create(catalog.as_ref(), &narrow).await.unwrap();
    }

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(
            shown("postgresql://u:secret@db:5432/shop"),
            "postgresql://u@db:5432/shop"
        );
        assert_eq!(shown("sqlite:/a/b.db?mode=rwc"), "sqlite:/a/b.db?mode=rwc");
    }
}
