//! Properties of the codec: requests round-trip through the encoder and the parser whatever their bytes;
//! however a pipelined buffer is split into reads, the same requests come out; random bytes never panic the
//! parsers; every value round-trips in the protocol it belongs to.

use dinomo_resp::value::{Value, ValueLimits};
use dinomo_resp::{ParseLimits, Protocol, ProtocolError, RequestParser, encode_request};
use proptest::prelude::*;

/// Feeds `chunks` one after another as reads, dropping what the parser consumed, and collects the requests.
fn parse_chunks<'a>(
    chunks: impl IntoIterator<Item = &'a [u8]>,
    limits: ParseLimits,
    authenticated: bool,
) -> (Vec<Vec<Vec<u8>>>, Option<ProtocolError>) {
    let mut p = RequestParser::new(limits);
    let mut buffer = Vec::new();
    let mut requests = Vec::new();
    for chunk in chunks {
        buffer.extend_from_slice(chunk);
        loop {
            let before = buffer.len();
            let (used, r) = p.parse(&buffer, authenticated);
            assert!(used <= before, "consumed more than it was given");
            buffer.drain(..used);
            match r {
                Ok(Some(args)) => requests.push(args),
                Ok(None) => break,
                Err(e) => return (requests, Some(e)),
            }
        }
    }
    (requests, None)
}

fn arg() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => proptest::collection::vec(any::<u8>(), 0..64),
        1 => proptest::collection::vec(any::<u8>(), 0..2000),
        // Around the size from which the parser takes an argument as it arrives.
        1 => (32_760usize..32_780, any::<u8>()).prop_map(|(n, b)| vec![b; n]),
    ]
}

fn request() -> impl Strategy<Value = Vec<Vec<u8>>> {
    proptest::collection::vec(arg(), 1..6)
}

/// An inline request (no quotes or blanks in its words), encoded, with the arguments it stands for.
fn inline_request() -> impl Strategy<Value = (Vec<u8>, Vec<Vec<u8>>)> {
    proptest::collection::vec("[a-zA-Z0-9:_-]{1,12}", 1..5).prop_map(|words| {
        let line = format!("{}\r\n", words.join(" ")).into_bytes();
        (line, words.into_iter().map(String::into_bytes).collect())
    })
}

/// The four leaves both protocols have; mixed in with weight 4, every leaf stays as likely as any other.
fn common_leaf() -> impl Strategy<Value = Value> {
    let line = "[ -~]{0,20}".prop_map(String::into_bytes);
    prop_oneof![
        line.clone().prop_map(Value::Simple),
        line.prop_map(Value::Error),
        any::<i64>().prop_map(Value::Integer),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::Bulk),
    ]
}

fn resp2_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        4 => common_leaf(),
        1 => Just(Value::NullBulk),
        1 => Just(Value::NullArray),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        proptest::collection::vec(inner, 0..6).prop_map(Value::Array)
    })
}

fn resp3_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        4 => common_leaf(),
        1 => Just(Value::Null),
        1 => any::<f64>()
            .prop_filter("NaN never equals itself", |x| !x.is_nan())
            .prop_map(Value::Double),
        1 => any::<bool>().prop_map(Value::Boolean),
        1 => "-?[1-9][0-9]{0,40}".prop_map(|s| Value::BigNumber(s.into_bytes())),
        1 => (
            any::<[u8; 3]>(),
            proptest::collection::vec(any::<u8>(), 0..40)
        )
            .prop_map(|(f, t)| Value::Verbatim(f, t)),
        1 => proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::BulkError),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Set),
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Push),
            proptest::collection::vec((inner.clone(), inner.clone()), 0..4).prop_map(Value::Map),
            (
                proptest::collection::vec((inner.clone(), inner.clone()), 1..3),
                inner
            )
                .prop_map(|(a, v)| Value::Attribute(a, Box::new(v))),
        ]
    })
}

/// Cuts `bytes` at the given fractions of its length.
fn split_at_fractions<'a>(bytes: &'a [u8], cuts: &[f64]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|f| (f * bytes.len() as f64) as usize)
        .collect();
    points.push(0);
    points.push(bytes.len());
    points.sort_unstable();
    points.windows(2).map(|w| &bytes[w[0]..w[1]]).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn requests_round_trip(args in request()) {
        let mut wire = Vec::new();
        encode_request(&args, &mut wire);
        let (got, err) = parse_chunks([wire.as_slice()], ParseLimits::default(), true);
        prop_assert_eq!(err, None);
        prop_assert_eq!(got, vec![args]);
    }

    #[test]
    fn any_split_of_a_pipeline_parses_the_same(
        multibulk in proptest::collection::vec(request(), 1..6),
        inline in proptest::collection::vec(inline_request(), 0..4),
        cuts in proptest::collection::vec(0.0f64..1.0, 0..12),
    ) {
        let mut wire = Vec::new();
        let mut want = Vec::new();
        for (i, args) in multibulk.into_iter().enumerate() {
            encode_request(&args, &mut wire);
            want.push(args);
            if let Some((line, words)) = inline.get(i) {
                wire.extend_from_slice(line);
                want.push(words.clone());
            }
        }
        let whole = parse_chunks([wire.as_slice()], ParseLimits::default(), true);
        prop_assert_eq!(&whole, &(want, None));
        let pieces = split_at_fractions(&wire, &cuts);
        prop_assert_eq!(parse_chunks(pieces, ParseLimits::default(), true), whole.clone());
        // Byte by byte too.
        prop_assert_eq!(parse_chunks(wire.chunks(1), ParseLimits::default(), true), whole);
    }

    #[test]
    fn random_bytes_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
        cuts in proptest::collection::vec(0.0f64..1.0, 0..8),
        authenticated in any::<bool>(),
    ) {
        let small = ParseLimits {
            max_bulk_len: 4096,
            max_multibulk_len: 64,
            max_inline_len: 256,
            max_request_bytes: 8192,
        };
        // Either requests, a wait for more, or an error: `parse_chunks` asserts progress and never loops.
        let whole = parse_chunks([bytes.as_slice()], small.clone(), authenticated);
        prop_assert_eq!(parse_chunks(split_at_fractions(&bytes, &cuts), small, authenticated), whole);
    }

    #[test]
    fn random_bytes_after_a_valid_prefix_never_panic(
        prefix in proptest::sample::select(vec![
            b"*".to_vec(), b"*2\r\n".to_vec(), b"*2\r\n$".to_vec(), b"*1\r\n$3\r\n".to_vec(),
            b"*99999999999999999999\r\n".to_vec(), b"\"".to_vec(), b"set '".to_vec(),
        ]),
        bytes in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let mut wire = prefix;
        wire.extend_from_slice(&bytes);
        let _ = parse_chunks([wire.as_slice()], ParseLimits::default(), true);
    }

    #[test]
    fn resp2_values_round_trip(v in resp2_value()) {
        let wire = v.to_bytes(Protocol::Resp2);
        prop_assert_eq!(Value::parse(&wire, &ValueLimits::default()), Ok(Some((v, wire.len()))));
    }

    #[test]
    fn resp3_values_round_trip(v in resp3_value()) {
        let wire = v.to_bytes(Protocol::Resp3);
        prop_assert_eq!(Value::parse(&wire, &ValueLimits::default()), Ok(Some((v, wire.len()))));
    }

    #[test]
    fn a_value_cut_short_asks_for_more(v in resp3_value(), cut in 0.0f64..1.0) {
        let wire = v.to_bytes(Protocol::Resp3);
        let at = (cut * wire.len() as f64) as usize;
        prop_assume!(at < wire.len());
        prop_assert_eq!(Value::parse(&wire[..at], &ValueLimits::default()), Ok(None));
    }

    #[test]
    fn random_bytes_never_panic_the_value_parser(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let limits = ValueLimits { max_bulk_len: 512, max_elements: 64, max_depth: 8 };
        let _ = Value::parse(&bytes, &limits);
    }
}
