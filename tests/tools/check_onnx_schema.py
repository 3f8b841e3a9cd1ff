#!/usr/bin/env python3
"""Compares dpexport's ONNX schema subset with the `onnx` package's own (e2e/export_onnx).

Usage: check_onnx_schema.py DESCRIPTOR_SET

DESCRIPTOR_SET: `protoc --descriptor_set_out` of app/export/onnx.proto. Every message, nested
message, enum and field there must exist in onnx's schema (onnx.onnx_ml_pb2) under the same name
with the same field number, type, label, message/enum type, oneof and packed option, and every
enum value with the same number. Prints one line per message; exits 1 listing the differences.
"""
import sys

from google.protobuf import descriptor_pb2
import onnx
import onnx.onnx_ml_pb2 as onnx_pb


def short(type_name):
    return type_name.rsplit(".", 1)[-1] if type_name else ""


def field_key(f, msg):
    oneof = msg.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else ""
    return (f.number, f.type, f.label, short(f.type_name), oneof, f.options.packed)


def compare_enum(mine, theirs, path, errors):
    values = {v.name: v.number for v in theirs.value}
    for v in mine.value:
        if values.get(v.name) != v.number:
            errors.append(f"{path}.{v.name} = {v.number}, onnx: {values.get(v.name)}")


def compare_message(mine, theirs, path, errors, counts):
    fields = {f.name: f for f in theirs.field}
    for f in mine.field:
        if f.name not in fields:
            errors.append(f"{path}.{f.name}: not in onnx's {path}")
            continue
        a, b = field_key(f, mine), field_key(fields[f.name], theirs)
        if a != b:
            errors.append(f"{path}.{f.name}: (number, type, label, type name, oneof, packed) "
                          f"{a}, onnx: {b}")
        counts[0] += 1
    nested = {m.name: m for m in theirs.nested_type}
    for m in mine.nested_type:
        if m.name not in nested:
            errors.append(f"{path}.{m.name}: no such nested message in onnx")
        else:
            compare_message(m, nested[m.name], f"{path}.{m.name}", errors, counts)
    enums = {e.name: e for e in theirs.enum_type}
    for e in mine.enum_type:
        if e.name not in enums:
            errors.append(f"{path}.{e.name}: no such enum in onnx")
        else:
            compare_enum(e, enums[e.name], f"{path}.{e.name}", errors)


def main():
    fds = descriptor_pb2.FileDescriptorSet()
    with open(sys.argv[1], "rb") as f:
        fds.ParseFromString(f.read())
    (mine,) = [fd for fd in fds.file if fd.name.endswith("onnx.proto")]
    theirs = descriptor_pb2.FileDescriptorProto()
    onnx_pb.DESCRIPTOR.CopyToProto(theirs)
    if mine.syntax not in ("", "proto2") or theirs.syntax not in ("", "proto2"):
        print(f"check_onnx_schema: syntax {mine.syntax!r}, onnx {theirs.syntax!r}")
        sys.exit(1)
    messages = {m.name: m for m in theirs.message_type}
    errors = []
    for m in mine.message_type:
        if m.name not in messages:
            errors.append(f"{m.name}: no such message in onnx")
            continue
        counts = [0]
        compare_message(m, messages[m.name], m.name, errors, counts)
        print(f"check_onnx_schema: {m.name}: {counts[0]} fields checked", flush=True)
    if errors:
        for e in errors:
            print(f"check_onnx_schema: FAIL: {e}")
        sys.exit(1)
    print(f"check_onnx_schema: ok, {len(mine.message_type)} messages match onnx {onnx.__version__}")


if __name__ == "__main__":
    main()
