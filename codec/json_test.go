package codec_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/logbus/logbus/codec"
	"pgregory.net/rapid"
)

type jsonEvent struct {
	ID     int64          `json:"id"`
	Name   string         `json:"name"`
	Tags   []string       `json:"tags"`
	Attrs  map[string]int `json:"attrs"`
	Parent *int64         `json:"parent"`
}

// jsonEventGen draws events JSON can represent exactly. Nil and empty
// collections both occur, since JSON keeps them apart (null versus [] or {}).
var jsonEventGen = rapid.Custom(func(t *rapid.T) jsonEvent {
	e := jsonEvent{
		ID:   rapid.Int64().Draw(t, "id"),
		Name: rapid.String().Draw(t, "name"),
	}
	if rapid.Bool().Draw(t, "hasTags") {
		e.Tags = rapid.SliceOf(rapid.String()).Draw(t, "tags")
	}
	if rapid.Bool().Draw(t, "hasAttrs") {
		e.Attrs = rapid.MapOf(rapid.String(), rapid.Int()).Draw(t, "attrs")
	}
	if rapid.Bool().Draw(t, "hasParent") {
		p := rapid.Int64().Draw(t, "parent")
		e.Parent = &p
	}
	return e
})

func TestJSON(t *testing.T) {
	testCodec(t, codec.JSON[jsonEvent](), jsonEventGen, nil)
}

func TestJSONEncodeError(t *testing.T) {
	b, err := codec.JSON[chan int]().Encode(make(chan int))
	var unsupported *json.UnsupportedTypeError
	if !errors.Is(err, codec.ErrEncode) || !errors.As(err, &unsupported) || b != nil {
		t.Errorf("Encode(chan) = %v, %v; want nil and an error wrapping ErrEncode and *json.UnsupportedTypeError", b, err)
	}
}

func TestJSONDecodeErrors(t *testing.T) {
	c := codec.JSON[jsonEvent]()
	for _, in := range []string{
		"",
		"{",
		"[]",
		`{"id":1} {}`,                   // trailing data
		`{"name":"partial","id":"one"}`, // type error after a valid field
		`{"tags":[1]}`,
		"\xff",
	} {
		v, err := c.Decode([]byte(in))
		if !errors.Is(err, codec.ErrDecode) {
			t.Errorf("Decode(%q) error = %v, want one wrapping ErrDecode", in, err)
		}
		if !strings.Contains(err.Error(), "jsonEvent") {
			t.Errorf("Decode(%q) error %q does not name the type", in, err)
		}
		if v.Name != "" || v.ID != 0 || v.Tags != nil {
			t.Errorf("Decode(%q) = %#v on error, want the zero value", in, v)
		}
	}

	_, err := c.Decode([]byte("{"))
	var syntax *json.SyntaxError
	if !errors.As(err, &syntax) {
		t.Errorf("Decode(%q) error %v does not expose *json.SyntaxError", "{", err)
	}
}

func FuzzJSONDecode(f *testing.F) {
	c := codec.JSON[jsonEvent]()
	for seed := range 5 {
		b, err := c.Encode(jsonEventGen.Example(seed))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		"",
		"null",
		"{",
		`{"id":1,"ID":2,"Id":3}`,
		`{"attrs":{"\xff":1,"\ufffd":2}}`,
		`{"name":"\xff\u0000<>&"}`,
		`{"id":1e3}`,
		`{"id":9223372036854775808}`,
		`{"tags":null,"attrs":{},"parent":null}`,
		`{"id":1} x`,
		strings.Repeat("[", 10000),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecode(t, c, data, nil)
	})
}
