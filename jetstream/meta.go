package jetstream

// How a record travels as a NATS message. Its value is the message's
// data, as it is. Its key and headers travel together in one NATS header,
// hdrMeta, in a binary form of logbus's own, base64-encoded, so that their
// bytes come back exactly as they were published: invalid UTF-8 included,
// a keyless record keyless and an empty key empty. (JSON, used before,
// turned invalid UTF-8 into U+FFFD, so two distinct header keys could
// merge.) Records stored in the earlier form (the key in hdrKey, base64;
// the headers in hdrHeaders, a JSON object) are still read.
//
// The binary form, version 1:
//
//	byte     1, the version
//	byte     flags: 1 when the record has a key
//	uvarint  key length, then the key            (only with flag 1)
//	uvarint  header count
//	         then per header, sorted by key:
//	uvarint  key length, then the key
//	uvarint  value length, then the value

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/logbus/logbus/engine"
	"github.com/nats-io/nats.go"
)

// The headers a record travels with: hdrMeta now, hdrKey and hdrHeaders
// in records stored by earlier versions (read, never written).
const (
	hdrMeta    = "Lb-Meta"
	hdrKey     = "Lb-Key"
	hdrHeaders = "Lb-Headers"
)

// recordHeaders are the headers that carry a record's key and headers, in
// every form: what a dead letter copies from the record.
var recordHeaders = []string{hdrMeta, hdrKey, hdrHeaders}

// MaxKeyAndHeadersSize bounds a record's key and headers together on this
// engine: the key's length plus, for every header, its key's and value's
// lengths, plus one to three bytes of framing for each of these lengths
// (one below 128 bytes). Publishing a larger record fails with an error
// wrapping pubsub.ErrInvalid, and nothing is stored; the in-memory engine
// has no such bound. Why: they travel in one NATS header, base64-encoded
// (4/3 of their size), the server refuses messages whose headers pass 64
// KiB, and a dead letter carries the record's key and headers with about
// 5 KiB of its own (the error text is cut to 4 KiB), which must fit too.
const MaxKeyAndHeadersSize = 40 << 10

// metaVersion is the first byte of the binary form.
const metaVersion = 1

// encodeMeta returns the binary form of key and headers; nil for a
// keyless record without headers, which needs no hdrMeta.
func encodeMeta(key []byte, headers map[string]string) []byte {
	if key == nil && len(headers) == 0 {
		return nil
	}
	size := 2 + binary.MaxVarintLen64*(2+2*len(headers)) + len(key)
	for k, v := range headers {
		size += len(k) + len(v)
	}
	b := make([]byte, 2, size)
	b[0] = metaVersion
	if key != nil {
		b[1] = 1
		b = binary.AppendUvarint(b, uint64(len(key)))
		b = append(b, key...)
	}
	b = binary.AppendUvarint(b, uint64(len(headers)))
	// Sorted, so that a record is always encoded alike.
	for _, k := range slices.Sorted(maps.Keys(headers)) {
		v := headers[k]
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	return b
}

var errMeta = errors.New("malformed")

// decodeMeta inverts encodeMeta. The key and header strings are copies:
// they do not keep b alive.
func decodeMeta(b []byte) (key []byte, headers map[string]string, err error) {
	if len(b) < 2 || b[0] != metaVersion {
		return nil, nil, fmt.Errorf("%w: version %v", errMeta, b[:min(len(b), 1)])
	}
	flags, b := b[1], b[2:]
	if flags&^1 != 0 {
		return nil, nil, fmt.Errorf("%w: flags %#x", errMeta, flags)
	}
	// next takes one length-prefixed field off b.
	next := func() ([]byte, bool) {
		n, used := binary.Uvarint(b)
		if used <= 0 || n > uint64(len(b)-used) {
			return nil, false
		}
		field := b[used : used+int(n)]
		b = b[used+int(n):]
		return field, true
	}
	if flags&1 != 0 {
		k, ok := next()
		if !ok {
			return nil, nil, fmt.Errorf("%w: key", errMeta)
		}
		key = append([]byte{}, k...)
	}
	count, used := binary.Uvarint(b)
	// Each header takes two bytes at least: a count beyond that is corrupt.
	if used <= 0 || count > uint64(len(b)-used)/2 {
		return nil, nil, fmt.Errorf("%w: header count", errMeta)
	}
	b = b[used:]
	if count > 0 {
		headers = make(map[string]string, count)
	}
	for range count {
		k, ok := next()
		if !ok {
			return nil, nil, fmt.Errorf("%w: header key", errMeta)
		}
		v, ok := next()
		if !ok {
			return nil, nil, fmt.Errorf("%w: header value", errMeta)
		}
		headers[string(k)] = string(v)
	}
	if len(b) != 0 {
		return nil, nil, fmt.Errorf("%w: %d bytes after the headers", errMeta, len(b))
	}
	return key, headers, nil
}

// setMeta puts rec's key and headers on h: refused with ErrInvalid past
// [MaxKeyAndHeadersSize].
func setMeta(h nats.Header, rec *engine.Record) error {
	meta := encodeMeta(rec.Key, rec.Headers)
	if len(meta) > MaxKeyAndHeadersSize {
		return fmt.Errorf("%w: the record's key (%d bytes) and headers take %d bytes, over the %d this engine carries (jetstream.MaxKeyAndHeadersSize)",
			engine.ErrInvalid, len(rec.Key), len(meta), MaxKeyAndHeadersSize)
	}
	if meta != nil {
		h.Set(hdrMeta, base64.RawStdEncoding.EncodeToString(meta))
	}
	return nil
}

// decodeRecord rebuilds the record a message carries.
func decodeRecord(h nats.Header, data []byte, seq uint64, created time.Time) (*engine.Record, error) {
	rec := &engine.Record{Offset: int64(seq) - 1, Value: data, Created: created}
	if rec.Value == nil {
		rec.Value = []byte{}
	}
	if v := h.Get(hdrMeta); v != "" {
		meta, err := base64.RawStdEncoding.DecodeString(v)
		if err == nil {
			rec.Key, rec.Headers, err = decodeMeta(meta)
		}
		if err != nil {
			return nil, fmt.Errorf("record at sequence %d: key and headers: %w", seq, err)
		}
		return rec, nil
	}
	// The form of records stored by earlier versions.
	if k, ok := h[hdrKey]; ok && len(k) > 0 {
		key, err := base64.StdEncoding.DecodeString(k[0])
		if err != nil {
			return nil, fmt.Errorf("record at sequence %d: key header: %w", seq, err)
		}
		rec.Key = key
		if rec.Key == nil {
			rec.Key = []byte{}
		}
	}
	if v := h.Get(hdrHeaders); v != "" {
		if err := json.Unmarshal([]byte(v), &rec.Headers); err != nil {
			return nil, fmt.Errorf("record at sequence %d: headers: %w", seq, err)
		}
	}
	return rec, nil
}

// decodeOrRaw is decodeRecord, but when the record cannot be decoded it
// returns, with the error, the record as it was stored: its value as it
// is, without key and headers, for a handler that cannot decode it (a
// dead letter at once) or a dead letter read back.
func decodeOrRaw(h nats.Header, data []byte, seq uint64, created time.Time) (*engine.Record, error) {
	rec, err := decodeRecord(h, data, seq, created)
	if err != nil {
		return &engine.Record{Offset: int64(seq) - 1, Value: data, Created: created}, err
	}
	return rec, nil
}

// headerLen is the size of h on the wire, as nats.go writes it and the
// server counts it against its limits (64 KiB of headers, max_payload
// with the data).
func headerLen(h nats.Header) int {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}
