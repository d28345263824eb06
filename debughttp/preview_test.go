package debughttp

import "testing"

func TestPreview(t *testing.T) {
	const limit = 10
	for _, tc := range []struct {
		name string
		in   string
		want preview
	}{
		{"nothing", "", preview{}},
		{"short text", "héllo", preview{Encoding: "utf-8", Text: "héllo", Size: 6}},
		{"tabs and newlines are text", "a\tb\nc", preview{Encoding: "utf-8", Text: "a\tb\nc", Size: 5}},
		{"long text is cut", "abcdefghijkl", preview{Encoding: "utf-8", Text: "abcdefghij", Size: 12, Truncated: true}},
		{"a cut never splits a character", "abcdefghié", preview{Encoding: "utf-8", Text: "abcdefghi", Size: 11, Truncated: true}},
		{"a cut before a four-byte character", "abcdefg😀x", preview{Encoding: "utf-8", Text: "abcdefg", Size: 12, Truncated: true}},
		{"invalid UTF-8 is hex", "a\xffb", preview{Encoding: "hex", Text: "61ff62", Size: 3}},
		{"a NUL is hex", "a\x00", preview{Encoding: "hex", Text: "6100", Size: 2}},
		{"an escape sequence is hex", "\x1b[31m", preview{Encoding: "hex", Text: "1b5b33316d", Size: 5}},
		{"a bidi override is hex", "a\u202eb", preview{Encoding: "hex", Text: "61e280ae62", Size: 5}},
		{"a zero-width space is hex", "a\u200bb", preview{Encoding: "hex", Text: "61e2808b62", Size: 5}},
		{"long binary shows half the limit in bytes", "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09", preview{Encoding: "hex", Text: "0001020304", Size: 10, Truncated: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := newPreview([]byte(tc.in), limit); got != tc.want {
				t.Errorf("newPreview(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
		})
	}
}

func TestVisible(t *testing.T) {
	for in, want := range map[string]string{
		"plain, é and\ttabs\n":  "plain, é and\ttabs\n",
		"bidi \u202e here":      `bidi \u202e here`,
		"nul \x00 and esc \x1b": `nul \x00 and esc \x1b`,
		"bad \xff byte":         `bad \xff byte`,
		"real \uFFFD stays":     "real \uFFFD stays",
	} {
		if got := visible(in); got != want {
			t.Errorf("visible(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestAge(t *testing.T) {
	for s, want := range map[float64]string{0: "0", -1: "0", 0.25: "250ms", 12.34: "12.3s", 125: "2m05s", 7980: "2h13m"} {
		if got := age(s); got != want {
			t.Errorf("age(%v) = %q, want %q", s, got, want)
		}
	}
	if got := joinInts([]int{2, 0, 1}); got != "0, 1, 2" {
		t.Errorf("joinInts = %q", got)
	}
}
