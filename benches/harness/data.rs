//! The harness's deterministic input: host metrics (`ts,host,cpu`) as CSV
//! and JSON lines, and the three Nexmark streams (persons, auctions, bids).
//!
//! Standard library only, so that `tests/main.rs` can include this file and
//! test it without building the harness.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Event time of the first row, epoch ms (2023-11-14).
pub const BASE_MS: i64 = 1_700_000_000_000;

/// How far behind the running maximum event time a row may be, exclusive:
/// a watermark delay of 2 s makes no row late.
pub const MAX_DISORDER_MS: i64 = 2_000;

/// SplitMix64: small, fast and the same on every machine.
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// A value in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What the metrics data is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricsSpec {
    /// Seed of the generator.
    pub seed: u64,
    /// Rows written.
    pub rows: u64,
    /// Distinct hosts; on average each sends one row per second of event
    /// time, so a 10 s window holds about ten rows per host.
    pub hosts: u64,
}

/// One row of the metrics data.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricRow {
    /// Event time, epoch ms.
    pub ts: i64,
    /// Host number, `0..hosts`.
    pub host: u64,
    /// CPU percentage in [0, 100), two decimals (hundredths).
    pub cpu_centi: u32,
}

/// Whether `host` is silent in second `sec`: 40 s out of every 300 s,
/// staggered across hosts, longer than the 30 s session gap of Q3, so
/// sessions close during the run.
fn quiet(host: u64, sec: u64) -> bool {
    (sec + host * 7) % 300 < 40
}

/// The metrics rows, in file order. Row `i`'s nominal time advances
/// `1000 / hosts` ms per row; its event time is the nominal time minus up
/// to [`MAX_DISORDER_MS`] (exclusive), so every row is within 2 s of the
/// running maximum.
pub struct Metrics {
    spec: MetricsSpec,
    rng: Rng,
    next: u64,
}

impl Metrics {
    /// The rows of `spec`.
    pub fn new(spec: MetricsSpec) -> Self {
        Self {
            spec,
            rng: Rng::new(spec.seed),
            next: 0,
        }
    }
}

impl Iterator for Metrics {
    type Item = MetricRow;

    fn next(&mut self) -> Option<MetricRow> {
        if self.next >= self.spec.rows {
            return None;
        }
        let i = self.next;
        self.next += 1;
        let hosts = self.spec.hosts.max(1);
        let nominal = BASE_MS + (i as u128 * 1000 / hosts as u128) as i64;
        let ts = nominal - self.rng.below(MAX_DISORDER_MS as u64) as i64;
        let sec = ((nominal - BASE_MS) / 1000) as u64;
        let mut host = self.rng.below(hosts);
        // Quiet runs are short: each host's quiet phase starts 7 s after
        // the previous host's.
        for _ in 0..hosts {
            if !quiet(host, sec) {
                break;
            }
            host = (host + 1) % hosts;
        }
        let cpu_centi = self.rng.below(10_000) as u32;
        Some(MetricRow {
            ts,
            host,
            cpu_centi,
        })
    }
}

/// The host name of host number `host`.
pub fn host_name(host: u64) -> String {
    format!("host-{host:06}")
}

/// Where the metrics files of `spec` live in `cache`, CSV then JSON lines.
pub fn metrics_paths(cache: &Path, spec: MetricsSpec) -> (PathBuf, PathBuf) {
    let stem = format!("metrics_s{}_r{}_h{}", spec.seed, spec.rows, spec.hosts);
    (
        cache.join(format!("{stem}.csv")),
        cache.join(format!("{stem}.jsonl")),
    )
}

/// Writes the metrics data as CSV (`ts,host,cpu`, ts in epoch ms) and as
/// JSON lines, unless both files are already there (they are written under
/// a temporary name and renamed, so a file that exists is complete).
pub fn write_metrics(cache: &Path, spec: MetricsSpec) -> io::Result<(PathBuf, PathBuf)> {
    let (csv_path, json_path) = metrics_paths(cache, spec);
    if csv_path.exists() && json_path.exists() {
        return Ok((csv_path, json_path));
    }
    let csv_tmp = csv_path.with_extension("csv.tmp");
    let json_tmp = json_path.with_extension("jsonl.tmp");
    let mut csv = BufWriter::with_capacity(1 << 20, File::create(&csv_tmp)?);
    let mut json = BufWriter::with_capacity(1 << 20, File::create(&json_tmp)?);
    writeln!(csv, "ts,host,cpu")?;
    for row in Metrics::new(spec) {
        let host = host_name(row.host);
        let (whole, cents) = (row.cpu_centi / 100, row.cpu_centi % 100);
        writeln!(csv, "{},{host},{whole}.{cents:02}", row.ts)?;
        writeln!(
            json,
            r#"{{"ts":{},"host":"{host}","cpu":{whole}.{cents:02}}}"#,
            row.ts
        )?;
    }
    csv.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    json.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(csv_tmp, &csv_path)?;
    std::fs::rename(json_tmp, &json_path)?;
    Ok((csv_path, json_path))
}

// --- Nexmark ---------------------------------------------------------------
//
// After the Nexmark generator of Apache Beam and of the nexmark project
// (its defaults): out of every 50 events 1 is a person, 3 are auctions and
// 46 are bids; ids start at 1000; a bid goes to a "hot" auction (the first
// of the latest block of 100) half the time and to one of the 100 latest
// auctions otherwise, and its bidder is a hot person three times in four;
// an auction's seller likewise; prices are `10^(6u) * 100` cents, u uniform
// in [0, 1). Events are in event-time order, `1000 / rate` ms apart.

/// Person, auction and bid weights out of [`NEXMARK_EPOCH`].
const PERSON_WEIGHT: u64 = 1;
const AUCTION_WEIGHT: u64 = 3;
/// Events per proportion cycle.
const NEXMARK_EPOCH: u64 = 50;
/// Ids of persons and auctions start here.
pub const FIRST_ID: u64 = 1000;
/// Hot auctions and people are the first of each block of this many.
const HOT_BLOCK: u64 = 100;
/// Active people and in-flight auctions a random pick chooses among.
const ACTIVE: u64 = 100;
const FIRST_NAMES: &[&str] = &[
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];
const LAST_NAMES: &[&str] = &[
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
];
const CITIES: &[&str] = &[
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
];
const STATES: &[&str] = &["AZ", "CA", "ID", "OR", "WA", "WY"];
const CHANNELS: &[&str] = &["Google", "Facebook", "Baidu", "Apple"];

/// What the Nexmark data is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NexmarkSpec {
    /// Seed of the generator.
    pub seed: u64,
    /// Events of all three kinds.
    pub events: u64,
    /// Events per second of event time.
    pub rate: u64,
}

/// Events of each kind that [`write_nexmark`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NexmarkCounts {
    /// Person events.
    pub persons: u64,
    /// Auction events.
    pub auctions: u64,
    /// Bid events.
    pub bids: u64,
}

/// One Nexmark event, as the CSV line of its stream (no newline).
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A new person.
    Person(String),
    /// A new auction.
    Auction(String),
    /// A bid.
    Bid(String),
}

/// The Nexmark events of a spec, in order.
pub struct Nexmark {
    spec: NexmarkSpec,
    rng: Rng,
    next: u64,
    persons: u64,
    auctions: u64,
}

impl Nexmark {
    /// The events of `spec`.
    pub fn new(spec: NexmarkSpec) -> Self {
        Self {
            spec,
            rng: Rng::new(spec.seed ^ 0x4E45_584D_4152_4B00),
            next: 0,
            persons: 0,
            auctions: 0,
        }
    }

    fn pick<'a>(&mut self, list: &[&'a str]) -> &'a str {
        list[self.rng.below(list.len() as u64) as usize]
    }

    fn word(&mut self, len: usize) -> String {
        (0..len)
            .map(|_| (b'a' + self.rng.below(26) as u8) as char)
            .collect()
    }

    fn price(&mut self) -> u64 {
        (10f64.powf(self.rng.unit() * 6.0) * 100.0).round() as u64
    }

    /// A person id: a hot one (3 times in 4) or one of the latest.
    fn person_id(&mut self) -> u64 {
        let last = self.persons.max(1) - 1;
        if self.rng.below(4) > 0 {
            FIRST_ID + last / HOT_BLOCK * HOT_BLOCK
        } else {
            FIRST_ID + last - self.rng.below(ACTIVE.min(last + 1))
        }
    }

    /// An auction id: a hot one (1 time in 2) or one of the latest.
    fn auction_id(&mut self) -> u64 {
        let last = self.auctions.max(1) - 1;
        if self.rng.below(2) > 0 {
            FIRST_ID + last / HOT_BLOCK * HOT_BLOCK
        } else {
            FIRST_ID + last - self.rng.below(ACTIVE.min(last + 1))
        }
    }

    fn person(&mut self, ts: i64) -> Event {
        let id = FIRST_ID + self.persons;
        self.persons += 1;
        let name = format!("{} {}", self.pick(FIRST_NAMES), self.pick(LAST_NAMES));
        let email = format!("{}@{}.com", self.word(7), self.word(5));
        let card = (0..4)
            .map(|_| format!("{:04}", self.rng.below(10_000)))
            .collect::<Vec<_>>()
            .join(" ");
        let city = self.pick(CITIES);
        let state = self.pick(STATES);
        let extra = self.word(100);
        Event::Person(format!(
            "{id},{name},{email},{card},{city},{state},{ts},{extra}"
        ))
    }

    fn auction(&mut self, ts: i64) -> Event {
        let id = FIRST_ID + self.auctions;
        self.auctions += 1;
        let item = self.word(10);
        let description = self.word(20);
        let initial = self.price();
        let reserve = initial + self.price();
        let expires = ts + 1000 + self.rng.below(20_000) as i64;
        let seller = self.person_id();
        let category = 10 + self.rng.below(5);
        let extra = self.word(100);
        Event::Auction(format!(
            "{id},{item},{description},{initial},{reserve},{ts},{expires},{seller},{category},{extra}"
        ))
    }

    fn bid(&mut self, ts: i64) -> Event {
        let auction = self.auction_id();
        let bidder = self.person_id();
        let price = self.price();
        let channel = self.pick(CHANNELS);
        let url = format!("https://www.nexmark.com/{}/item.htm", self.word(5));
        let extra = self.word(20);
        Event::Bid(format!(
            "{auction},{bidder},{price},{channel},{url},{ts},{extra}"
        ))
    }
}

impl Iterator for Nexmark {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        if self.next >= self.spec.events {
            return None;
        }
        let n = self.next;
        self.next += 1;
        let ts = BASE_MS + (n as u128 * 1000 / self.spec.rate.max(1) as u128) as i64;
        let offset = n % NEXMARK_EPOCH;
        Some(if offset < PERSON_WEIGHT {
            self.person(ts)
        } else if offset < PERSON_WEIGHT + AUCTION_WEIGHT {
            self.auction(ts)
        } else {
            self.bid(ts)
        })
    }
}

/// CSV headers of the person, auction and bid files.
pub const PERSON_HEADER: &str = "id,name,email_address,credit_card,city,state,date_time,extra";
pub const AUCTION_HEADER: &str =
    "id,item_name,description,initial_bid,reserve,date_time,expires,seller,category,extra";
pub const BID_HEADER: &str = "auction,bidder,price,channel,url,date_time,extra";

/// The person, auction and bid files of `spec` in `cache`.
pub fn nexmark_paths(cache: &Path, spec: NexmarkSpec) -> [PathBuf; 3] {
    let stem = format!("nexmark_s{}_e{}_r{}", spec.seed, spec.events, spec.rate);
    ["person", "auction", "bid"].map(|kind| cache.join(format!("{stem}_{kind}.csv")))
}

/// Counts of each kind for `spec`, without generating the events.
pub fn nexmark_counts(spec: NexmarkSpec) -> NexmarkCounts {
    let cycles = spec.events / NEXMARK_EPOCH;
    let rest = spec.events % NEXMARK_EPOCH;
    let persons = cycles * PERSON_WEIGHT + rest.min(PERSON_WEIGHT);
    let auctions = cycles * AUCTION_WEIGHT + rest.saturating_sub(PERSON_WEIGHT).min(AUCTION_WEIGHT);
    NexmarkCounts {
        persons,
        auctions,
        bids: spec.events - persons - auctions,
    }
}

/// Writes the three Nexmark CSV files, unless they are there already.
pub fn write_nexmark(cache: &Path, spec: NexmarkSpec) -> io::Result<[PathBuf; 3]> {
    let paths = nexmark_paths(cache, spec);
    if paths.iter().all(|p| p.exists()) {
        return Ok(paths);
    }
    let tmp = paths.clone().map(|p| p.with_extension("csv.tmp"));
    let mut out = Vec::new();
    for (path, header) in tmp.iter().zip([PERSON_HEADER, AUCTION_HEADER, BID_HEADER]) {
        let mut w = BufWriter::with_capacity(1 << 20, File::create(path)?);
        writeln!(w, "{header}")?;
        out.push(w);
    }
    for event in Nexmark::new(spec) {
        let (i, line) = match &event {
            Event::Person(l) => (0, l),
            Event::Auction(l) => (1, l),
            Event::Bid(l) => (2, l),
        };
        writeln!(out[i], "{line}")?;
    }
    for w in out {
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    for (from, to) in tmp.iter().zip(&paths) {
        std::fs::rename(from, to)?;
    }
    Ok(paths)
}
