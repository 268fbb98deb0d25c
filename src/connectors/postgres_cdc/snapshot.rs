//! A piece of the initial snapshot: one read-only `REPEATABLE READ` transaction (one
//! MVCC snapshot) that reads tables in key order, a chunk per `COPY`.

use super::catalog::{self, Refusal, TableInfo};
use super::config::{quote_ident, quote_literal, CdcConfig};
use super::copy_text::Rows;
use super::visibility::Snapshot;
use crate::clients::postgres::describe;
use futures_util::StreamExt;
use tokio_postgres::Client;

/// An open piece.
pub struct Piece {
    client: Client,
    /// The transaction's snapshot.
    pub snapshot: Snapshot,
    /// The WAL insert position read after the snapshot was taken.
    pub insert_lsn: u64,
    /// The tables as this piece's transaction sees them.
    pub tables: Vec<TableInfo>,
}

/// The query of one chunk: the table's columns, the rows after key `after` (each key
/// column's text) in key order, at most `limit`.
pub fn chunk_sql(t: &TableInfo, after: Option<&[String]>, limit: u64) -> String {
    let cols: Vec<String> = t
        .shape
        .columns
        .iter()
        .map(|c| quote_ident(&c.name))
        .collect();
    let key: Vec<String> = t
        .shape
        .key
        .iter()
        .map(|&i| quote_ident(&t.shape.columns[i].name))
        .collect();
    let filter = match after {
        None => String::new(),
        Some(after) => {
            let bound: Vec<String> = after
                .iter()
                .zip(&t.key_types)
                .map(|(v, ty)| format!("{}::{ty}", quote_literal(v)))
                .collect();
            format!(" WHERE ({}) > ({})", key.join(", "), bound.join(", "))
        }
    };
    format!(
        "COPY (SELECT {} FROM {}{filter} ORDER BY {} LIMIT {limit}) TO STDOUT",
        cols.join(", "),
        t.name.sql(),
        key.join(", ")
    )
}

impl Piece {
    /// Begins a piece on `client` (a session of its own), under the exported snapshot
    /// `exported` when given (the one the slot was created with), else a new one.
    pub async fn begin(
        client: Client,
        cfg: &CdcConfig,
        exported: Option<&str>,
    ) -> Result<Piece, Refusal> {
        let fail = |what: &str, e: tokio_postgres::Error| Refusal {
            fatal: false,
            message: format!("{what}: {}", describe(&e)),
        };
        catalog::set_session(&client).await?;
        client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
            .map_err(|e| fail("beginning the snapshot's transaction", e))?;
        if let Some(name) = exported {
            client
                .batch_execute(&format!("SET TRANSACTION SNAPSHOT {}", quote_literal(name)))
                .await
                .map_err(|e| fail("taking the slot's snapshot", e))?;
        }
        let row = client
            .query_one(
                "SELECT pg_current_snapshot()::text, pg_current_wal_insert_lsn()::text",
                &[],
            )
            .await
            .map_err(|e| fail("reading the snapshot", e))?;
        let snapshot = Snapshot::parse(row.get(0)).map_err(Refusal::fatal)?;
        let insert_lsn = super::lsn::parse(row.get(1)).map_err(Refusal::fatal)?;
        let tables = catalog::tables(&client, cfg).await?;
        Ok(Piece {
            client,
            snapshot,
            insert_lsn,
            tables,
        })
    }

    /// The rows of table `t` after key `after`, at most `limit`, in key order.
    pub async fn chunk(
        &self,
        t: &TableInfo,
        after: Option<&[String]>,
        limit: u64,
    ) -> Result<Vec<Vec<Option<String>>>, Refusal> {
        let sql = chunk_sql(t, after, limit);
        let fail = |e: tokio_postgres::Error| Refusal {
            fatal: false,
            message: format!("reading table {}: {}", t.name.stream(), describe(&e)),
        };
        let stream = self.client.copy_out(sql.as_str()).await.map_err(fail)?;
        let mut stream = std::pin::pin!(stream);
        let mut rows = Rows::default();
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            rows.feed(&chunk.map_err(fail)?, &mut out)
                .map_err(Refusal::fatal)?;
        }
        rows.finish().map_err(Refusal::fatal)?;
        Ok(out)
    }

    /// Ends the piece's transaction.
    pub async fn end(self) {
        // Read only: nothing to keep; a failure leaves nothing behind either.
        let _ = self.client.batch_execute("COMMIT").await;
    }
}

#[cfg(test)]
mod tests {
    use super::super::events::{Column, Shape};
    use super::*;
    use std::sync::Arc;

    fn info(key: Vec<usize>) -> TableInfo {
        let col = |n: &str| Column {
            name: n.into(),
            type_oid: 23,
            type_modifier: -1,
        };
        TableInfo {
            oid: 1,
            name: super::super::config::TableName {
                schema: "public".into(),
                name: "t".into(),
            },
            shape: Shape {
                stream: Arc::from("public.t"),
                schema: "public".into(),
                table: "t".into(),
                columns: vec![col("a"), col("b"), col("c")],
                key: key.clone(),
            },
            key_types: key.iter().map(|_| "integer".to_string()).collect(),
            types: vec!["integer".into(); 3],
        }
    }

    #[test]
    fn chunks_go_on_after_the_last_key_in_key_order() {
        assert_eq!(
            chunk_sql(&info(vec![0]), None, 10),
            "COPY (SELECT \"a\", \"b\", \"c\" FROM \"public\".\"t\" ORDER BY \"a\" LIMIT 10) TO STDOUT"
        );
        assert_eq!(
            chunk_sql(&info(vec![0]), Some(&["5".into()]), 10),
            "COPY (SELECT \"a\", \"b\", \"c\" FROM \"public\".\"t\" WHERE (\"a\") > ('5'::integer) ORDER BY \"a\" LIMIT 10) TO STDOUT"
        );
        assert_eq!(
            chunk_sql(&info(vec![2, 0]), Some(&["5".into(), "it's".into()]), 3),
            "COPY (SELECT \"a\", \"b\", \"c\" FROM \"public\".\"t\" WHERE (\"c\", \"a\") > ('5'::integer, 'it''s'::integer) ORDER BY \"c\", \"a\" LIMIT 3) TO STDOUT"
        );
    }
}
