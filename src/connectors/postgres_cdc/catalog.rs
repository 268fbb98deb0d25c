//! What the source asks the server before it reads: the settings and privileges it
//! needs, the tables' columns and keys, the publication and the slot. Each check that
//! fails says what to change, naming the setting.

use super::config::{quote_ident, quote_literal, CdcConfig, TableName};
use super::events::{Column, Shape};
use crate::clients::postgres::describe;
use std::sync::Arc;
use tokio_postgres::Client;

/// Why the source cannot start: `fatal` when no restart cures it (a setting, a
/// privilege, a table without a key), else a failure worth retrying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub fatal: bool,
    pub message: String,
}

impl Refusal {
    /// A refusal no restart cures.
    pub fn fatal(message: impl Into<String>) -> Refusal {
        Refusal {
            fatal: true,
            message: message.into(),
        }
    }

    fn of(what: &str, e: &tokio_postgres::Error) -> Refusal {
        Refusal {
            fatal: false,
            message: format!("{what}: {}", describe(e)),
        }
    }
}

type Checked<T> = Result<T, Refusal>;

/// The session settings under which values are read: the text forms
/// [`super::values`] converts (ISO dates, UTC, hex bytea, shortest exact floats).
pub const SESSION_SETTINGS: &[(&str, &str)] = &[
    ("DateStyle", "ISO"),
    ("IntervalStyle", "postgres"),
    ("TimeZone", "UTC"),
    ("extra_float_digits", "1"),
    ("bytea_output", "hex"),
    ("standard_conforming_strings", "on"),
];

/// Sets [`SESSION_SETTINGS`] on a session.
pub async fn set_session(client: &Client) -> Checked<()> {
    let sql: String = SESSION_SETTINGS
        .iter()
        .map(|(k, v)| format!("SET {k} = {};", quote_literal(v)))
        .collect();
    client
        .batch_execute(&sql)
        .await
        .map_err(|e| Refusal::of("setting the session", &e))
}

async fn one_text(client: &Client, sql: &str, what: &str) -> Checked<Option<String>> {
    let rows = client
        .query(sql, &[])
        .await
        .map_err(|e| Refusal::of(what, &e))?;
    Ok(rows.first().and_then(|r| r.get::<_, Option<String>>(0)))
}

/// The server's facts the source needs: its database, and whether it can decode.
#[derive(Debug, Clone)]
pub struct Server {
    pub database: String,
    pub role: String,
    /// `server_version_num` (150004 for 15.4).
    pub version: i32,
}

/// Checks `wal_level = logical` and the role's `REPLICATION` privilege.
pub async fn check_server(client: &Client) -> Checked<Server> {
    let version: i32 = one_text(
        client,
        "SELECT current_setting('server_version_num')",
        "reading the server's version",
    )
    .await?
    .and_then(|v| v.parse().ok())
    .unwrap_or_default();
    if version < 140_000 {
        return Err(Refusal::fatal(format!(
            "the server is PostgreSQL {}.{}: change data capture needs PostgreSQL 14 or later (pgoutput's logical messages, pg_current_snapshot, the slot's wal_status)",
            version / 10_000,
            version % 10_000 / 100
        )));
    }
    let level = one_text(
        client,
        "SELECT current_setting('wal_level')",
        "reading wal_level",
    )
    .await?
    .unwrap_or_default();
    if level != "logical" {
        return Err(Refusal::fatal(format!(
            "the server's wal_level is {level}: change data capture needs wal_level = logical in postgresql.conf (ALTER SYSTEM SET wal_level = logical, then restart the server)"
        )));
    }
    let rows = client
        .query(
            "SELECT current_database()::text, current_user::text, r.rolreplication OR r.rolsuper FROM pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await
        .map_err(|e| Refusal::of("reading the role", &e))?;
    let row = rows
        .first()
        .ok_or_else(|| Refusal::fatal("the session's role is not in pg_roles"))?;
    let (database, role, replication): (String, String, bool) =
        (row.get(0), row.get(1), row.get(2));
    if !replication {
        return Err(Refusal::fatal(format!(
            "role {role} may not replicate: ALTER ROLE {} REPLICATION (logical replication needs the REPLICATION attribute)",
            quote_ident(&role)
        )));
    }
    Ok(Server {
        database,
        role,
        version,
    })
}

/// A table's shape as the catalog has it, with its key's types as SQL names them
/// (with the column's collation: keys compare as the primary key orders them).
#[derive(Debug, Clone)]
pub struct TableInfo {
    /// The table's `pg_class` oid: the stream names a relation by it.
    pub oid: u32,
    pub name: TableName,
    pub shape: Shape,
    pub key_types: Vec<String>,
    /// Every column's type as SQL names it.
    pub types: Vec<String>,
}

/// Reads each table's columns and primary key; a missing table, one without a
/// primary key or one the role may not read is refused, naming it.
pub async fn tables(client: &Client, cfg: &CdcConfig) -> Checked<Vec<TableInfo>> {
    let mut out = Vec::with_capacity(cfg.tables.len());
    for t in &cfg.tables {
        let stream = t.stream();
        let rows = client
            .query(
                "SELECT a.attname::text, a.atttypid::oid, a.atttypmod, \
                 format_type(a.atttypid, a.atttypmod) || coalesce(' COLLATE ' || quote_ident(cn.nspname) || '.' || quote_ident(co.collname), ''), \
                 coalesce((SELECT k.n FROM unnest(i.indkey) WITH ORDINALITY AS k(att, n) WHERE k.att = a.attnum), 0)::int4, \
                 has_table_privilege(c.oid, 'SELECT'), c.relkind::text, c.relreplident::text, c.oid::oid \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
                 LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0 \
                 LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace \
                 LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary \
                 WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p') \
                 ORDER BY a.attnum",
                &[&t.schema, &t.name],
            )
            .await
            .map_err(|e| Refusal::of(&format!("reading table {stream}"), &e))?;
        if rows.is_empty() {
            return Err(Refusal::fatal(format!(
                "table {stream} (key tables) does not exist in the database"
            )));
        }
        if !rows[0].get::<_, bool>(5) {
            return Err(Refusal::fatal(format!(
                "the role may not read table {stream}: GRANT SELECT ON {} TO the role",
                t.sql()
            )));
        }
        let (relkind, identity, oid): (String, String, u32) =
            (rows[0].get(6), rows[0].get(7), rows[0].get(8));
        if relkind == "p" {
            return Err(Refusal::fatal(format!(
                "table {stream} is partitioned: the source reads plain tables (name its partitions in tables instead)"
            )));
        }
        if identity == "n" || identity == "i" {
            return Err(Refusal::fatal(format!(
                "table {stream} has REPLICA IDENTITY {}: its updates and deletes would not name the row by its primary key; ALTER TABLE {} REPLICA IDENTITY DEFAULT (or FULL, for the old row in before)",
                if identity == "n" { "NOTHING" } else { "USING INDEX" },
                t.sql()
            )));
        }
        let mut columns = Vec::new();
        let mut types = Vec::new();
        let mut key: Vec<(i32, usize)> = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            columns.push(Column {
                name: r.get(0),
                type_oid: r.get(1),
                type_modifier: r.get(2),
            });
            types.push(r.get::<_, String>(3));
            let at: i32 = r.get(4);
            if at > 0 {
                key.push((at, i));
            }
        }
        if key.is_empty() {
            return Err(Refusal::fatal(format!(
                "table {stream} has no primary key: the source reads a table in key order and names each event by its key; give it one (ALTER TABLE {} ADD PRIMARY KEY (...))",
                t.sql()
            )));
        }
        key.sort_unstable();
        let key: Vec<usize> = key.into_iter().map(|(_, i)| i).collect();
        let key_types = key.iter().map(|&i| types[i].clone()).collect();
        out.push(TableInfo {
            oid,
            name: t.clone(),
            shape: Shape {
                stream: Arc::from(stream.as_str()),
                schema: t.schema.clone(),
                table: t.name.clone(),
                columns,
                key,
            },
            key_types,
            types,
        });
    }
    Ok(out)
}

/// Makes sure the publication exists and covers every table with inserts, updates,
/// deletes and truncates: created when missing, an existing one checked and used as
/// it is.
/// `version` is the server's `server_version_num`.
pub async fn ensure_publication(client: &Client, cfg: &CdcConfig, version: i32) -> Checked<()> {
    let name = &cfg.publication;
    let found = client
        .query(
            "SELECT pubinsert AND pubupdate AND pubdelete FROM pg_publication WHERE pubname = $1",
            &[name],
        )
        .await
        .map_err(|e| Refusal::of("reading pg_publication", &e))?;
    let Some(row) = found.first() else {
        let list: Vec<String> = cfg.tables.iter().map(TableName::sql).collect();
        let sql = format!(
            "CREATE PUBLICATION {} FOR TABLE {}",
            quote_ident(name),
            list.join(", ")
        );
        return match client.batch_execute(&sql).await {
            Ok(()) => {
                tracing::info!(publication = %name, "created the publication");
                Ok(())
            }
            // Another start created it in between: check that one.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_OBJECT) => {
                Box::pin(ensure_publication(client, cfg, version)).await
            }
            Err(e) => Err(Refusal::fatal(format!(
                "creating publication {name} (key publication): {}; create it as a role that owns the tables: {sql}",
                describe(&e)
            ))),
        };
    };
    if !row.get::<_, bool>(0) {
        return Err(Refusal::fatal(format!(
            "publication {name} (key publication) does not publish every insert, update and delete: ALTER PUBLICATION {} SET (publish = 'insert, update, delete, truncate')",
            quote_ident(name)
        )));
    }
    let covered = client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
            &[name],
        )
        .await
        .map_err(|e| Refusal::of("reading pg_publication_tables", &e))?;
    let covered: Vec<(String, String)> = covered.iter().map(|r| (r.get(0), r.get(1))).collect();
    if let Some(t) = cfg
        .tables
        .iter()
        .find(|t| !covered.contains(&(t.schema.clone(), t.name.clone())))
    {
        return Err(Refusal::fatal(format!(
            "publication {name} (key publication) does not cover table {}: ALTER PUBLICATION {} ADD TABLE {}",
            t.stream(),
            quote_ident(name),
            t.sql()
        )));
    }
    // PostgreSQL 15 lets a publication filter rows or columns: changes would be
    // missing from the stream without a word.
    if version >= 150_000 {
        let rows = client
            .query(
                "SELECT n.nspname::text || '.' || c.relname::text FROM pg_publication_rel r \
                 JOIN pg_publication p ON p.oid = r.prpubid JOIN pg_class c ON c.oid = r.prrelid \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE p.pubname = $1 AND (r.prqual IS NOT NULL OR r.prattrs IS NOT NULL)",
                &[name],
            )
            .await
            .map_err(|e| Refusal::of("reading pg_publication_rel", &e))?;
        let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        if let Some(t) = cfg.tables.iter().find(|t| names.contains(&t.stream())) {
            return Err(Refusal::fatal(format!(
                "publication {name} (key publication) filters the rows or columns of table {}: every change of every column is needed; ALTER PUBLICATION {} SET TABLE ... without WHERE or a column list",
                t.stream(),
                quote_ident(name)
            )));
        }
    }
    Ok(())
}

/// A replication slot as `pg_replication_slots` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub plugin: Option<String>,
    pub database: Option<String>,
    pub confirmed_flush: Option<u64>,
    pub active_pid: Option<i32>,
    /// `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: Option<String>,
}

/// The slot `name`, if it exists.
pub async fn slot(client: &Client, name: &str) -> Checked<Option<Slot>> {
    let rows = client
        .query(
            "SELECT plugin::text, database::text, confirmed_flush_lsn::text, active_pid, wal_status \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await
        .map_err(|e| Refusal::of("reading pg_replication_slots", &e))?;
    let Some(r) = rows.first() else {
        return Ok(None);
    };
    let confirmed: Option<String> = r.get(2);
    Ok(Some(Slot {
        plugin: r.get(0),
        database: r.get(1),
        confirmed_flush: confirmed
            .map(|t| super::lsn::parse(&t))
            .transpose()
            .map_err(Refusal::fatal)?,
        active_pid: r.get(3),
        wal_status: r.get(4),
    }))
}

/// Why slot `slot` (named `name`) cannot be used by this source in database `db`.
pub fn unusable(name: &str, slot: &Slot, db: &str) -> Option<String> {
    if slot.plugin.as_deref() != Some("pgoutput") {
        return Some(format!(
            "replication slot {name} (key slot) is not a logical slot of pgoutput (plugin {:?}): name another slot",
            slot.plugin.as_deref().unwrap_or("none, a physical slot")
        ));
    }
    if slot.database.as_deref() != Some(db) {
        return Some(format!(
            "replication slot {name} (key slot) belongs to database {:?}, the source reads {db:?}: name another slot",
            slot.database.as_deref().unwrap_or("")
        ));
    }
    if slot.wal_status.as_deref() == Some("lost") {
        return Some(format!(
            "replication slot {name} (key slot) has lost WAL it needs (wal_status = lost: max_slot_wal_keep_size was exceeded while the job was behind); its changes cannot be read exactly any more. The way out is a new snapshot: drop the slot (SELECT pg_drop_replication_slot('{name}')) and start the job without a checkpoint"
        ));
    }
    None
}

/// The server's current WAL position, for the lag metrics.
pub async fn current_lsn(client: &Client) -> Checked<u64> {
    let text = one_text(
        client,
        "SELECT pg_current_wal_lsn()::text",
        "reading the WAL position",
    )
    .await?
    .unwrap_or_default();
    super::lsn::parse(&text).map_err(Refusal::fatal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(plugin: &str, db: &str, wal: &str) -> Slot {
        Slot {
            plugin: Some(plugin.into()),
            database: Some(db.into()),
            confirmed_flush: Some(1),
            active_pid: None,
            wal_status: Some(wal.into()),
        }
    }

    #[test]
    fn a_slot_of_another_kind_database_or_lost_is_unusable() {
        assert_eq!(
            unusable("s", &slot("pgoutput", "shop", "reserved"), "shop"),
            None
        );
        assert!(unusable("s", &slot("wal2json", "shop", "reserved"), "shop")
            .unwrap()
            .contains("not a logical slot of pgoutput"));
        assert!(
            unusable("s", &slot("pgoutput", "other", "reserved"), "shop")
                .unwrap()
                .contains("belongs to database \"other\"")
        );
        let lost = unusable("s", &slot("pgoutput", "shop", "lost"), "shop").unwrap();
        assert!(
            lost.contains("wal_status = lost") && lost.contains("pg_drop_replication_slot('s')")
        );
    }
}
