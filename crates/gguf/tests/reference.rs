//! The readers against gguf-py (fixtures/gguf/dequant.json, scripts/make_gguf_fixtures.py): two
//! random blocks of every type stoke reads, dequantized by gguf 0.19's numpy code. And the reader
//! on hostile headers: every declared length is checked before it is trusted.

use std::path::{Path, PathBuf};

use stoke_gguf::{GgmlType, GgufError, GgufFile, TensorSpec, Value, quant, write_gguf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/gguf")
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn every_type_dequantizes_as_gguf_py_does() {
    let text = std::fs::read_to_string(root().join("dequant.json")).expect("dequant.json");
    let fixture: serde_json::Value = serde_json::from_str(&text).expect("parses");
    let cases = fixture["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 10, "F16, BF16 and eight block types");
    for case in cases {
        let name = case["type"].as_str().expect("type");
        let dtype = GgmlType::from_code(case["code"].as_u64().expect("code") as u32);
        assert_eq!(dtype.to_string(), name);
        let expected: Vec<f32> = serde_json::from_value(case["values"].clone()).expect("values");
        let values = quant::dequantize(
            dtype,
            &hex(case["hex"].as_str().expect("hex")),
            expected.len(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        for (i, (a, b)) in values.iter().zip(&expected).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                "{name}[{i}]: stoke {a}, gguf-py {b}"
            );
        }
    }
}

/// A minimal valid file: one metadata string and one 32-value F32 tensor.
fn tiny_file(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.gguf");
    let metadata = vec![(
        "general.architecture".to_string(),
        Value::String("llama".into()),
    )];
    let specs = [TensorSpec {
        name: "t".into(),
        shape: vec![32],
        dtype: GgmlType::F32,
    }];
    write_gguf(&path, &metadata, &specs, |_| {
        quant::quantize(
            GgmlType::F32,
            &(0..32).map(|i| i as f32).collect::<Vec<_>>(),
        )
    })
    .expect("write");
    path
}

fn reopen(dir: &Path, bytes: &[u8]) -> Result<GgufFile, GgufError> {
    let path = dir.join("edited.gguf");
    std::fs::write(&path, bytes).expect("write");
    GgufFile::open(&path)
}

#[test]
fn written_files_read_back_and_hostile_headers_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = tiny_file(dir.path());
    let file = GgufFile::open(&path).expect("open");
    assert_eq!(file.version, 3);
    assert_eq!(file.str("general.architecture").unwrap(), Some("llama"));
    let (shape, values) = file.tensor_f32("t").expect("tensor");
    assert_eq!(shape, vec![32]);
    assert_eq!(values[31], 31.0);
    let missing = file.tensor_f32("u").expect_err("missing");
    assert!(
        missing.to_string().contains("tensor `u` is missing"),
        "{missing}"
    );

    let good = std::fs::read(&path).expect("read");
    // Offsets: magic 0, version 4, tensor count 8, metadata count 16, first key length 24.
    let edit = |at: usize, bytes: &[u8]| {
        let mut b = good.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        b
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (edit(4, &7u32.to_le_bytes()), "version 7"),
        (edit(8, &u64::MAX.to_le_bytes()), "tensor infos"),
        (edit(16, &(1u64 << 40).to_le_bytes()), "metadata entries"),
        (edit(24, &(1u64 << 62).to_le_bytes()), "metadata key #0"),
        // The value type of `general.architecture`: 99 is no type.
        (
            edit(24 + 8 + 20, &99u32.to_le_bytes()),
            "unknown value type 99",
        ),
        (good[..good.len() - 100].to_vec(), "truncated"),
    ];
    for (bytes, expected) in cases {
        let err = reopen(dir.path(), &bytes).expect_err(expected);
        let message = err.to_string();
        assert!(
            message.contains(expected),
            "expected {expected:?} in: {message}"
        );
        assert!(message.contains("edited.gguf"), "names the file: {message}");
    }

    // general.alignment = 0 would divide by zero in a careless reader.
    let zero_alignment = dir.path().join("align.gguf");
    let metadata = vec![("general.alignment".to_string(), Value::U32(0))];
    write_gguf(&zero_alignment, &metadata, &[], |_| Ok(Vec::new())).expect("write");
    let err = GgufFile::open(&zero_alignment).expect_err("alignment 0");
    assert!(err.to_string().contains("general.alignment"), "{err}");
}
