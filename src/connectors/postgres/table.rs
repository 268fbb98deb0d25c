//! The target table as the catalog describes it, read once at open, and the sink's
//! layout over it: which columns it writes, from where, and which are the key.

use super::config::{escape_pointer, Mode, PgConfig, Source};
use super::types::Kind;
use tokio_postgres::Client;

/// One column of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    /// The type without its modifier (`character varying`, `numeric`), which the
    /// values' text is cast to; the column's own modifier applies on assignment, so
    /// that a value too long is an error rather than cut.
    pub sql_type: String,
    pub kind: Kind,
    pub not_null: bool,
    pub has_default: bool,
    /// A generated column, or an identity column `GENERATED ALWAYS`: never written.
    pub read_only: bool,
    /// An identity or serial column (its default draws from a sequence): an upsert
    /// that leaves it out keeps its value rather than drawing a new one.
    pub sequence: bool,
}

/// The table, as read from the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// `schema.table`, each part quoted as needed: what the statements name.
    pub qualified: String,
    pub columns: Vec<Column>,
    /// The column sets of its unique indexes (plain ones: no predicate, no
    /// expression), which `ON CONFLICT` can name.
    pub unique: Vec<Vec<String>>,
    /// Inserts may go by `COPY` (no row-level security, no rules).
    pub copy: bool,
}

/// `name` as an SQL identifier, always quoted: the catalog's spelling, kept.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `s` as an SQL string literal.
pub fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Reads the table `name` (resolved by the server's rules: unquoted names fold to
/// lower case, a schema may be given) from the catalog. An error names the table.
pub async fn load(client: &Client, name: &str) -> Result<Table, String> {
    let row = client
        .query_one("SELECT to_regclass($1)::oid", &[&name])
        .await
        .map_err(|e| {
            format!(
                "looking up table `{name}`: {}",
                crate::clients::postgres::describe(&e)
            )
        })?;
    let Some(oid): Option<u32> = row.get(0) else {
        return Err(format!(
            "table `{name}` does not exist (the sink creates no table: create it first)"
        ));
    };
    let row = client
        .query_one(
            "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname), c.relkind::text, \
                    (c.relrowsecurity OR c.relhasrules) \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
            &[&oid],
        )
        .await
        .map_err(|e| crate::clients::postgres::describe(&e))?;
    let qualified: String = row.get(0);
    let relkind: String = row.get(1);
    // COPY FROM is refused under row-level security and skips rules: INSERT then.
    let copy = !row.get::<_, bool>(2);
    if relkind != "r" && relkind != "p" {
        return Err(format!(
            "`{name}` is not a table (relkind {relkind}): the sink writes into tables"
        ));
    }
    let rows = client
        .query(
            // format_type with -1, not NULL: without a modifier, NULL names bpchar
            // `character` (char(1)) and bit `bit` (bit(1)), and a cast to those cuts.
            // A domain's value is cast to its base type (an explicit cast to the
            // domain itself would cut a varchar or pad a bit string); the assignment to
            // the column then checks the domain, and refuses what does not fit.
            "SELECT a.attname::text, format_type(COALESCE(b.oid, t.oid), -1), \
                    COALESCE(b.typname, t.typname)::text, COALESCE(b.typcategory, t.typcategory)::text, \
                    CASE WHEN b.oid IS NULL THEN a.atttypmod ELSE t.typtypmod END, a.attnotnull, (a.atthasdef OR a.attidentity <> ''), \
                    (a.attgenerated <> '' OR a.attidentity = 'a'), \
                    (a.attidentity <> '' OR COALESCE(pg_get_expr(d.adbin, d.adrelid) LIKE 'nextval(%', false)) \
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
             LEFT JOIN pg_type b ON t.typtype = 'd' AND b.oid = t.typbasetype \
             LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
             WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&oid],
        )
        .await
        .map_err(|e| crate::clients::postgres::describe(&e))?;
    let columns = rows
        .iter()
        .map(|r| {
            let typname: String = r.get(2);
            let category: String = r.get(3);
            Column {
                name: r.get(0),
                sql_type: r.get(1),
                kind: Kind::of(&typname, &category, r.get(4)),
                not_null: r.get(5),
                has_default: r.get(6),
                read_only: r.get(7),
                sequence: r.get(8),
            }
        })
        .collect();
    let rows = client
        .query(
            // The key columns only (not INCLUDE's), of indexes checked at once (a
            // deferrable one is refused by ON CONFLICT).
            "SELECT ARRAY(SELECT a.attname::text FROM unnest(i.indkey) WITH ORDINALITY k(attnum, n) \
                          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                          WHERE k.n <= i.indnkeyatts) \
             FROM pg_index i WHERE i.indrelid = $1 AND i.indisunique AND i.indimmediate AND i.indisvalid \
               AND i.indpred IS NULL AND i.indexprs IS NULL",
            &[&oid],
        )
        .await
        .map_err(|e| crate::clients::postgres::describe(&e))?;
    let unique = rows.iter().map(|r| r.get::<_, Vec<String>>(0)).collect();
    Ok(Table {
        qualified,
        columns,
        unique,
        copy,
    })
}

/// One written column: the table's column and where its value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub column: Column,
    pub source: Source,
}

/// What the sink writes into the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub table: String,
    pub written: Vec<Written>,
    /// Positions in `written` of the key columns, in `key`'s order.
    pub key: Vec<usize>,
    /// Inserts may go by `COPY` ([`Table::copy`]).
    pub copy: bool,
}

/// The layout of `cfg` over `table`: every column it names exists and can be written,
/// and an upsert's key is a unique index of the table. An error names the column.
pub fn layout(cfg: &PgConfig, table: &Table) -> Result<Layout, String> {
    let find = |name: &str| -> Result<&Column, String> {
        let c = table
            .columns
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = table.columns.iter().map(|c| c.name.as_str()).collect();
                format!(
                    "table {} has no column `{name}` (its columns: {})",
                    table.qualified,
                    names.join(", ")
                )
            })?;
        if c.read_only {
            return Err(format!(
                "column `{name}` of {} is generated: the database writes it, the sink cannot",
                table.qualified
            ));
        }
        Ok(c)
    };
    let written: Vec<Written> = match &cfg.columns {
        Some(cols) => cols
            .iter()
            .map(|(name, source)| {
                Ok(Written {
                    column: find(name)?.clone(),
                    source: source.clone(),
                })
            })
            .collect::<Result<_, String>>()?,
        None => table
            .columns
            .iter()
            .filter(|c| !c.read_only)
            .map(|c| Written {
                column: c.clone(),
                source: Source::Pointer(format!("/{}", escape_pointer(&c.name))),
            })
            .collect(),
    };
    let mut key = Vec::new();
    for k in &cfg.key {
        find(k)?;
        let at = written
            .iter()
            .position(|w| w.column.name == *k)
            .ok_or_else(|| format!("key column `{k}` is not written"))?;
        key.push(at);
        let column = &written[at].column;
        if let (Mode::Upsert, Some(kind), Kind::Numeric | Kind::Float) =
            (cfg.mode, &cfg.keyed_before, &column.kind)
        {
            return Err(format!(
                "key column `{k}` of {} is {}, which compares numbers by value (1 and 1.0 are one row), while the `{kind}` before the sink keys records by their text (1 and 1.0 are two keys, whose states would write one row): key the table by a text column, or give the key field one spelling and a text key column",
                table.qualified, column.sql_type
            ));
        }
    }
    if cfg.mode == Mode::Upsert {
        let mut want: Vec<&str> = cfg.key.iter().map(String::as_str).collect();
        want.sort_unstable();
        let covered = table.unique.iter().any(|u| {
            let mut have: Vec<&str> = u.iter().map(String::as_str).collect();
            have.sort_unstable();
            have == want
        });
        if !covered {
            return Err(format!(
                "mode = \"upsert\" needs a primary key or unique index on ({}) of {}: ON CONFLICT names one (create it, or use mode = \"insert\")",
                cfg.key.join(", "),
                table.qualified
            ));
        }
    }
    Ok(Layout {
        table: table.qualified.clone(),
        written,
        key,
        copy: table.copy,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn column(name: &str, typname: &str) -> Column {
        Column {
            name: name.into(),
            sql_type: typname.into(),
            kind: Kind::of(typname, "N", -1),
            not_null: false,
            has_default: false,
            read_only: false,
            sequence: false,
        }
    }

    pub fn table() -> Table {
        let mut gen = column("total_x2", "int8");
        gen.read_only = true;
        Table {
            qualified: "public.t".into(),
            columns: vec![column("user", "text"), column("total", "int8"), gen],
            unique: vec![vec!["user".into()]],
            copy: true,
        }
    }

    pub fn cfg(mode: Mode, key: &[&str], columns: Option<Vec<(&str, Source)>>) -> PgConfig {
        PgConfig {
            endpoint: crate::clients::postgres::Endpoint {
                url: crate::secret::UrlText("postgresql://u@h/db".into()),
                password: None,
                sslmode: crate::clients::postgres::SslMode::Disable,
                ca_cert: None,
                connect_timeout_ms: 1000,
            },
            table: "t".into(),
            mode,
            key: key.iter().map(|k| k.to_string()).collect(),
            columns: columns.map(|c| c.into_iter().map(|(n, s)| (n.to_string(), s)).collect()),
            delivery: super::super::config::Delivery::TwoPhase,
            batch_max_rows: 100,
            on_item_error: crate::dead_letter::OnError::Fail,
            dead_letter_kafka: None,
            job: "j".into(),
            lock_timeout_ms: 1000,
            keyed_before: None,
        }
    }

    /// An upsert keyed by a numeric column after a keyed transform is refused: the
    /// column makes `1` and `1.0` one row, the transform two keys (two states, one row).
    #[test]
    fn a_numeric_upsert_key_after_a_keyed_transform_is_refused() {
        let numeric = Table {
            columns: vec![column("user", "numeric"), column("total", "int8")],
            ..table()
        };
        let mut c = cfg(Mode::Upsert, &["user"], None);
        assert!(layout(&c, &numeric).is_ok(), "without a keyed transform");
        c.keyed_before = Some("rolling_sum".into());
        let e = layout(&c, &numeric).unwrap_err();
        assert!(
            e.contains("key column `user`") && e.contains("rolling_sum"),
            "{e}"
        );
        assert!(layout(&c, &table()).is_ok(), "a text key column");
        let float = Table {
            columns: vec![column("user", "float8"), column("total", "int8")],
            ..table()
        };
        assert!(layout(&c, &float).is_err());
        c.mode = Mode::Insert;
        assert!(layout(&c, &numeric).is_ok(), "inserts have no row identity");
    }

    #[test]
    fn without_columns_every_writable_column_comes_from_its_field() {
        let l = layout(&cfg(Mode::Upsert, &["user"], None), &table()).unwrap();
        let names: Vec<&str> = l.written.iter().map(|w| w.column.name.as_str()).collect();
        assert_eq!(
            names,
            ["user", "total"],
            "the generated column is not written"
        );
        assert_eq!(l.written[0].source, Source::Pointer("/user".into()));
        assert_eq!(l.key, vec![0]);
    }

    #[test]
    fn a_missing_or_generated_column_is_named() {
        let c = cfg(
            Mode::Insert,
            &[],
            Some(vec![("totl", Source::Pointer("/t".into()))]),
        );
        let e = layout(&c, &table()).unwrap_err();
        assert!(
            e.contains("no column `totl`") && e.contains("user, total"),
            "{e}"
        );
        let c = cfg(
            Mode::Insert,
            &[],
            Some(vec![("total_x2", Source::Pointer("/t".into()))]),
        );
        assert!(layout(&c, &table()).unwrap_err().contains("generated"));
    }

    #[test]
    fn an_upsert_key_must_be_a_unique_index() {
        let e = layout(&cfg(Mode::Upsert, &["total"], None), &table()).unwrap_err();
        assert!(e.contains("unique index on (total)"), "{e}");
        // Insert mode deletes by any columns.
        assert!(layout(&cfg(Mode::Insert, &["total"], None), &table()).is_ok());
    }
}
