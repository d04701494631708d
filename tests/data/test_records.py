import json

import pytest

from prorag.data import (
    DataFileError,
    Passage,
    Question,
    load_corpus,
    load_passages,
    load_questions,
    read_jsonl,
    write_jsonl,
)

QUESTION = {"id": "q1", "question": "Who wrote  Hamlet?\n", "golden_answers": ["Shakespeare", " "],
            "dataset": "demo", "supporting_passage_ids": ["p1"]}


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_malformed_json_names_file_and_line(tmp_path):
    path = _write(tmp_path / "q.jsonl", [json.dumps(QUESTION), "", '{"id": "q2", "question": '])
    with pytest.raises(DataFileError) as error:
        load_questions(path)
    assert error.value.line == 3
    assert f"{path}:3" in str(error.value)
    assert "malformed JSON" in str(error.value)


def test_non_object_line_is_rejected(tmp_path):
    path = _write(tmp_path / "q.jsonl", ["[1, 2]"])
    with pytest.raises(DataFileError, match=r"q\.jsonl:1: expected a JSON object"):
        read_jsonl(path)


def test_missing_file_names_its_path(tmp_path):
    with pytest.raises(DataFileError, match=r"nowhere\.jsonl: file not found"):
        load_passages(tmp_path / "nowhere.jsonl")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"golden_answers": "Shakespeare"}, "golden_answers"),
        ({"golden_answers": [" "]}, "no non-empty answer"),
        ({"question": 3}, "field 'question' must be a string"),
        ({"dataset": None}, "field 'dataset' must be a string"),
        ({"supporting_passage_ids": ["p1", ""]}, "supporting_passage_ids"),
        ({"metadata": []}, "metadata"),
    ],
)
def test_invalid_question_field_names_field_and_line(tmp_path, change, message):
    path = _write(tmp_path / "q.jsonl", [json.dumps(QUESTION), json.dumps({**QUESTION, "id": "q2", **change})])
    with pytest.raises(DataFileError, match=rf"q\.jsonl:2: invalid question record: .*{message}"):
        load_questions(path)


def test_missing_field_is_named(tmp_path):
    record = {key: value for key, value in QUESTION.items() if key != "question"}
    with pytest.raises(DataFileError, match="missing field 'question'"):
        load_questions(_write(tmp_path / "q.jsonl", [json.dumps(record)]))


def test_duplicate_question_ids_within_a_dataset(tmp_path):
    path = _write(tmp_path / "q.jsonl", [json.dumps(QUESTION), json.dumps(QUESTION)])
    with pytest.raises(DataFileError, match=r"q\.jsonl:2: duplicate question id 'q1'.*line 1"):
        load_questions(path)


def test_question_normalization_and_round_trip(tmp_path):
    [question] = load_questions(_write(tmp_path / "demo_file.jsonl", [json.dumps({**QUESTION, "id": 7})]))
    assert question.id == "7"
    assert question.question == "Who wrote Hamlet?"
    assert question.golden_answers == ("Shakespeare",)
    assert question.source == "demo_file"
    assert question.key == "demo/7"
    assert Question.from_dict(question.to_dict()) == question


def test_passage_contents_and_normalization():
    passage = Passage.from_dict({"id": "p1", "title": "Hamlet", "text": "A  tragedy\u2028by Shakespeare."})
    assert passage.text == "A tragedy by Shakespeare."
    assert passage.contents == "Hamlet\nA tragedy by Shakespeare."
    with pytest.raises(ValueError, match="'text' is empty"):
        Passage.from_dict({"id": "p2", "title": "x", "text": "  "})


def test_write_jsonl_round_trips_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "out" / "records.jsonl"
    assert write_jsonl(path, [{"a": 1}, {"b": "ü"}]) == 2
    assert read_jsonl(path) == [{"a": 1}, {"b": "ü"}]
    assert [p.name for p in path.parent.iterdir()] == ["records.jsonl"]


def test_every_vendored_file_loads(project_root):
    raw = project_root / "data" / "01_raw"
    counts = {path.stem: len(load_questions(path)) for path in sorted((raw / "qa").glob("*.jsonl"))}
    assert counts == {"bamboogle": 125, "hotpotqa": 700, "musique": 200, "musique_train": 120, "nq": 1000,
                      "popqa": 700, "triviaqa": 633}
    assert len(load_corpus(sorted((raw / "corpus").glob("*.jsonl")))) == 23575


def test_a_non_utf8_byte_names_file_and_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_bytes(json.dumps(QUESTION).encode() + b"\n" + b'{"id": "q2", "question": "caf\xe9?"}\n')
    with pytest.raises(DataFileError, match=r"q\.jsonl:2: not UTF-8: byte 0xe9") as error:
        load_questions(path)
    assert error.value.line == 2 and error.value.__cause__ is None
    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(b'{"id": "p1", "title": "T", "text": "ok"}\n{"id": "p2", "title": "T", "text": "\xc3("}\n')
    with pytest.raises(DataFileError, match=r"c\.jsonl:2: not UTF-8: byte 0xc3"):
        load_corpus([corpus])


def test_an_empty_question_or_corpus_file_is_an_error(tmp_path):
    empty = _write(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(DataFileError, match=r"empty\.jsonl: no question records"):
        load_questions(empty)
    passages = _write(tmp_path / "corpus.jsonl", [json.dumps({"id": "p1", "title": "T", "text": "x"})])
    with pytest.raises(DataFileError, match=r"empty\.jsonl: no passage records"):
        load_corpus([passages, empty])
