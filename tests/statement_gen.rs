//! Builds vigil scripts from a string of bytes: each byte picks the next
//! grammar choice, so any bytes give a script that mostly parses and
//! reaches the planner. Shared by the property tests (`tests/props.rs`)
//! and the grammar-aware fuzz target (`fuzz/`), which includes this file
//! by path; it uses nothing but std.

/// The statements the conformance cases declare first, so generated
/// queries have streams to read.
pub const PRELUDE: &str = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE, n BIGINT, ok BOOLEAN,
    WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH (path = 'm.csv');
CREATE STREAM e (ts TIMESTAMP, kind TEXT, v DOUBLE) WITH (path = 'e.jsonl', format = 'jsonl', allowed_lateness = '5 seconds');
CREATE SINK out WITH (connector = 'file', path = 'out.csv');
";

/// Reads grammar choices from bytes; once the bytes run out every choice
/// is the first (simplest) option, so generation always ends.
pub struct Choices<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Choices<'a> {
    /// Choices drawn from `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    /// The next byte, or 0 when there are none left.
    pub fn byte(&mut self) -> u8 {
        let b = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    /// True when all bytes are used.
    pub fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    /// A number below `n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.byte() as usize % n
    }

    /// True once in `n` choices (n > 0).
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// Mostly the first of `options` (three times in four), else any: the
    /// first is the valid choice, so most statements plan.
    pub fn usual<'o>(&mut self, options: &[&'o str]) -> &'o str {
        if self.byte() < 192 {
            options[0]
        } else {
            self.pick(options)
        }
    }

    /// One of `options`.
    pub fn pick<'o>(&mut self, options: &[&'o str]) -> &'o str {
        options[self.below(options.len())]
    }
}

const COLUMNS: &[&str] = &[
    "ts",
    "host",
    "cpu",
    "n",
    "ok",
    "kind",
    "v",
    "nosuch",
    "window_start",
    "window_end",
];
const AGGREGATES: &[&str] = &[
    "count(*)",
    "count(*)",
    "max(cpu)",
    "avg(cpu)",
    "sum(n)",
    "min(cpu)",
    "max(v)",
    "count(host)",
    "median(cpu)",
    "stddev(cpu)",
    "approx_percentile_cont(cpu, 0.9)",
    "sum(host)",
    "avg(ok)",
];
const OPERATORS: &[&str] = &[
    "+", "-", "*", "/", "%", "AND", "OR", "=", "<>", "<", ">=", "||", "LIKE",
];
const LITERALS: &[&str] = &[
    "1",
    "0",
    "-1",
    "2.5",
    "'a'",
    "''",
    "NULL",
    "TRUE",
    "9223372036854775807",
    "1e308",
    "INTERVAL '1' SECOND",
    "TIMESTAMP '2024-01-01 00:00:00'",
    "'x''y'",
];
const FUNCTIONS: &[&str] = &[
    "abs",
    "upper",
    "length",
    "coalesce",
    "round",
    "sqrt",
    "nosuchfn",
    "date_trunc",
];
const INTERVALS: &[&str] = &[
    "INTERVAL '10' SECOND",
    "INTERVAL '10' SECOND",
    "INTERVAL '1' MINUTE",
    "INTERVAL '1' MINUTE",
    "INTERVAL '5' SECOND",
    "INTERVAL '0' SECOND",
    "INTERVAL '1' MILLISECOND",
    "INTERVAL '1' DAY",
    "INTERVAL '1' MONTH",
    "INTERVAL '-5' SECOND",
    "INTERVAL '30 seconds'",
    "5",
];
const TYPES: &[&str] = &[
    "TIMESTAMP",
    "TEXT",
    "DOUBLE",
    "BIGINT",
    "BOOLEAN",
    "INT",
    "VARCHAR",
    "FLOAT",
    "DATE",
    "BLOB",
];

/// A whole script: the prelude (unless the first byte says otherwise) and
/// up to six generated statements.
pub fn script(bytes: &[u8]) -> String {
    let mut c = Choices::new(bytes);
    let mut out = String::new();
    if !c.one_in(8) {
        out.push_str(PRELUDE);
    }
    let count = 1 + c.below(6);
    for i in 0..count {
        out.push_str(&statement(&mut c, i));
        out.push_str(";\n");
        if c.done() {
            break;
        }
    }
    out
}

/// One statement (without its `;`); `index` makes names unique.
pub fn statement(c: &mut Choices, index: usize) -> String {
    match c.below(10) {
        0 => create_stream(c, index),
        1 => format!(
            "CREATE SINK s{index} WITH (connector = '{}', path = 'o{index}.{}', format = '{}'{})",
            c.pick(&["file", "stdout", "webhook", "nosuch"]),
            c.pick(&["csv", "jsonl"]),
            c.pick(&["csv", "json", "jsonl", "table"]),
            c.pick(&[
                "",
                ", append_only = 'true'",
                ", url = 'http://127.0.0.1:1/'"
            ]),
        ),
        2 => format!("CREATE VIEW v{index} AS {}", select(c, 0)),
        3 => format!(
            "CREATE ALERT a{index} AS {}{} {}",
            windowed_select(c),
            emit(c),
            alert(c)
        ),
        4 => format!(
            "CREATE INVARIANT i{index} AS {} LEARN {} OF {} TRAIN FOR {}{}",
            select(c, 0),
            c.pick(&["SET", "RANGE"]),
            c.pick(COLUMNS),
            c.pick(&[
                "INTERVAL '1' MINUTE",
                "3 WINDOWS",
                "0 WINDOWS",
                "INTERVAL '1' MONTH"
            ]),
            c.pick(&["", " MODE ONLINE", " MODE OFFLINE", " BY host"]),
        ),
        5 => format!(
            "SET {} = {}",
            c.pick(&["execution_mode", "nosuch"]),
            c.pick(&["'per_record'", "micro_batch", "'fast'", "1", "TRUE"])
        ),
        6 => format!("EXPLAIN {}{}", windowed_select(c), emit(c)),
        7 => format!(
            "INSERT INTO {} {}",
            c.pick(&["out", "nosink"]),
            select(c, 0)
        ),
        8 => format!("{}{} {}", windowed_select(c), emit(c), alert(c)),
        _ => format!("{}{}", select(c, 0), emit(c)),
    }
}

fn create_stream(c: &mut Choices, index: usize) -> String {
    let mut columns = vec!["ts TIMESTAMP".to_string()];
    for k in 0..c.below(4) {
        columns.push(format!("c{k} {}", c.pick(TYPES)));
    }
    if c.one_in(2) {
        columns.push(format!(
            "WATERMARK FOR {} AS {}",
            c.pick(&["ts", "c0", "nosuch"]),
            c.pick(&[
                "ts",
                "ts - INTERVAL '1' SECOND",
                "ts + INTERVAL '1' SECOND",
                "ts - 5",
                "c0"
            ]),
        ));
    }
    format!(
        "CREATE STREAM s{index} ({}) WITH ({})",
        columns.join(", "),
        c.pick(&[
            "path = 'x.csv'",
            "path = 'x.jsonl', format = 'jsonl'",
            "connector = 'host', interval = '1 second'",
            "connector = 'demo', limit = '10'",
            "connector = 'push'",
            "path = 'x.csv', allowed_lateness = 'soon'",
            "path = 'x.csv', idle_timeout = '1 second', follow = 'true'",
            "connector = 'nosuch'",
        ])
    )
}

/// A query over a window with its aggregate, the shape most of vigil's
/// features need.
fn windowed_select(c: &mut Choices) -> String {
    // The valid choices come more often than the invalid ones, so most
    // queries get all the way through the planner.
    let key = c.usual(&["host", "kind"]);
    let mut sql = format!(
        "SELECT window_start, window_end, {key}, {} AS x FROM {}",
        c.usual(AGGREGATES),
        window(c)
    );
    if c.one_in(3) {
        sql.push_str(&format!(" WHERE cpu > {}", c.usual(LITERALS)));
    }
    sql.push_str(&format!(" GROUP BY window_start, window_end, {key}"));
    if c.one_in(4) {
        sql.push_str(&format!(" HAVING {} > 1", c.usual(AGGREGATES)));
    }
    sql
}

fn window(c: &mut Choices) -> String {
    let stream = c.usual(&["m", "e", "v0", "nosuch"]);
    match c.below(3) {
        0 => format!("TUMBLE({stream}, ts, {})", c.usual(INTERVALS)),
        1 => format!(
            "HOP({stream}, ts, {}, {})",
            c.usual(INTERVALS),
            c.usual(INTERVALS)
        ),
        _ => format!("SESSION({stream}, ts, {})", c.usual(INTERVALS)),
    }
}

fn select(c: &mut Choices, depth: usize) -> String {
    match c.below(5) {
        0 => windowed_select(c),
        1 if depth < 2 => format!(
            "SELECT * FROM ({}) {}",
            select(c, depth + 1),
            c.pick(&["AS q", "q", ""])
        ),
        2 if depth < 2 => format!(
            "{} UNION ALL {}",
            select(c, depth + 1),
            select(c, depth + 1)
        ),
        _ => {
            let items: Vec<String> = (0..=c.below(3)).map(|_| expr(c, 0)).collect();
            let mut sql = format!(
                "SELECT {} FROM {}",
                items.join(", "),
                c.pick(&[
                    "m",
                    "e",
                    "v0",
                    "v1",
                    "m AS a JOIN m AS b ON a.host = b.host"
                ])
            );
            if c.one_in(2) {
                sql.push_str(&format!(" WHERE {} = {}", expr(c, 0), expr(c, 0)));
            }
            sql.push_str(c.pick(&["", "", " ORDER BY ts", " LIMIT 3", " GROUP BY host"]));
            sql
        }
    }
}

fn expr(c: &mut Choices, depth: usize) -> String {
    if depth > 4 {
        return c.pick(COLUMNS).to_string();
    }
    match c.below(8) {
        0 | 1 => c.pick(COLUMNS).to_string(),
        2 => c.pick(LITERALS).to_string(),
        3 | 4 => format!(
            "{} {} {}",
            expr(c, depth + 1),
            c.pick(OPERATORS),
            expr(c, depth + 1)
        ),
        5 => format!("{}({})", c.pick(FUNCTIONS), expr(c, depth + 1)),
        6 => format!(
            "CASE WHEN {} THEN {} ELSE {} END",
            expr(c, depth + 1),
            expr(c, depth + 1),
            expr(c, depth + 1)
        ),
        _ => format!("CAST({} AS {})", expr(c, depth + 1), c.pick(TYPES)),
    }
}

fn emit(c: &mut Choices) -> String {
    c.usual(&[
        "",
        "",
        " EMIT CHANGES",
        " EMIT ON WINDOW CLOSE",
        " EMIT EVERY INTERVAL '1' SECOND",
        " EMIT EVERY INTERVAL '0' SECOND",
        " EMIT SOMETIMES",
    ])
    .to_string()
}

fn alert(c: &mut Choices) -> String {
    let mut sql = format!(
        "ALERT {}WHEN {}",
        c.pick(&["", "BY host ", "BY nosuch "]),
        c.pick(&[
            "x > 1",
            "x > 1 AND host <> 'b'",
            "ABSENT FOR INTERVAL '1' MINUTE",
            "nosuch",
            "x"
        ])
    );
    sql.push_str(c.usual(&[
        "",
        " FOR INTERVAL '10' SECOND",
        " FOR 2 WINDOWS",
        " FOR 0 WINDOWS",
        " RESOLVE WHEN x < 1",
    ]));
    sql.push_str(c.pick(&[
        "",
        " SEVERITY 'critical'",
        " MESSAGE 'x is {x} on {host}'",
        " MESSAGE '{nosuch'",
    ]));
    sql
}
