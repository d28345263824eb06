package codec

// String returns a Codec that stores a string as its raw bytes.
//
// Encode allocates a new slice holding the string's bytes; Decode allocates a
// new string from data, so neither result shares memory with its input.
//
// The bytes are not validated as UTF-8: a Go string may hold any bytes, and
// rejecting some would make the codec lossy. As a result every string
// round-trips exactly, every byte slice decodes, and neither method fails.
//
// The returned Codec is stateless, safe for concurrent use, and an
// [Appender].
func String() Codec[string] {
	return stringCodec{}
}

type stringCodec struct{}

func (stringCodec) Encode(v string) ([]byte, error) { return []byte(v), nil }

func (stringCodec) Decode(data []byte) (string, error) { return string(data), nil }

func (stringCodec) AppendEncode(dst []byte, v string) ([]byte, error) { return append(dst, v...), nil }
