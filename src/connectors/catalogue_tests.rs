//! The fixed columns of the connectors that have them, checked against
//! the catalogue rules (`connector::catalogue`).

use datafusion::arrow::datatypes::TimeUnit;

use datafusion::arrow::datatypes::{DataType, Field, Schema};

use super::registry::catalogue;
use crate::connector::catalogue::*;

fn schema(fields: &[(&str, DataType)]) -> Schema {
    Schema::new(
        fields
            .iter()
            .map(|(n, t)| Field::new(*n, t.clone(), true))
            .collect::<Vec<_>>(),
    )
}

#[test]
fn catalogues_are_well_formed() {
    for connector in ["host", "demo"] {
        let cat = catalogue(connector).unwrap();
        assert_eq!(cat[0].name, "ts", "{connector}");
        assert_eq!(
            cat[0].data_type,
            DataType::Timestamp(TimeUnit::Millisecond, None)
        );
        for (i, c) in cat.iter().enumerate() {
            assert!(!c.meaning.is_empty(), "{}", c.name);
            let name = sql_type(&c.data_type);
            assert!(
                ["TIMESTAMP", "TEXT", "DOUBLE", "BIGINT", "BOOLEAN", "MAP<"]
                    .iter()
                    .any(|t| name.starts_with(t)),
                "{}: {name}",
                c.name
            );
            assert!(
                !cat[..i].iter().any(|d| d.name == c.name),
                "{} twice",
                c.name
            );
        }
        let full = full_schema(cat);
        let all = match_columns("s", connector, &full, cat).unwrap();
        assert_eq!(all, (0..cat.len()).collect::<Vec<_>>());
    }
    assert!(catalogue("file").is_none());
}

#[test]
fn columns_match_by_name_in_any_order() {
    let cat = catalogue("host").unwrap();
    let s = schema(&[
        ("CPU", DataType::Float64),
        ("ts", DataType::Timestamp(TimeUnit::Millisecond, None)),
        ("host", DataType::Utf8),
    ]);
    let idx = match_columns("h", "host", &s, cat).unwrap();
    assert_eq!(cat[idx[0]].name, "cpu");
    assert_eq!(cat[idx[1]].name, "ts");
    assert_eq!(cat[idx[2]].name, "host");
}

#[test]
fn unknown_or_mistyped_columns_list_the_catalogue() {
    let cat = catalogue("host").unwrap();
    let e = match_columns("h", "host", &schema(&[("gpu", DataType::Float64)]), cat)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("stream h") && e.contains("'gpu'") && e.contains("cpu DOUBLE"),
        "{e}"
    );
    assert!(e.contains("processes BIGINT"), "{e}");
    let e = match_columns("h", "host", &schema(&[("cpu", DataType::Int64)]), cat)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("'cpu'") && e.contains("is DOUBLE, not BIGINT") && e.contains("ts TIMESTAMP"),
        "{e}"
    );
    let cat = catalogue("demo").unwrap();
    let e = match_columns("d", "demo", &schema(&[("cpu", DataType::Float64)]), cat)
        .unwrap_err()
        .to_string();
    assert!(e.contains("metric TEXT, value DOUBLE"), "{e}");
}
