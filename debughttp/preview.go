package debughttp

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// previewLimit is how many bytes of a key or value a preview shows.
const previewLimit = 256

// preview is a safe look at bytes of unknown content: the page escapes it
// like any text, and it never carries a control or format character that
// could disguise what is shown (a bidi override, a zero-width space).
// Without [WithPayloads] only Size is set.
type preview struct {
	Encoding  string `json:"encoding,omitempty"` // "utf-8", "hex", or "" for no bytes or none shown
	Text      string `json:"text,omitempty"`
	Size      int    `json:"size"`                // bytes in full
	Truncated bool   `json:"truncated,omitempty"` // Text shows only the first bytes
}

// newPreview shows at most limit bytes of b: as text when they are valid
// UTF-8 made of printable characters, tabs and newlines; as hex otherwise.
// A cut never splits a character.
func newPreview(b []byte, limit int) preview {
	p := preview{Size: len(b)}
	if len(b) == 0 {
		return p
	}
	shown := b
	if len(shown) > limit {
		p.Truncated = true
		cut := limit
		// Back off to the start of the character the cut falls in, so that
		// text stays valid UTF-8.
		for cut > 0 && limit-cut < utf8.UTFMax && !utf8.RuneStart(b[cut]) {
			cut--
		}
		if cut == 0 || limit-cut >= utf8.UTFMax {
			cut = limit // not UTF-8 anyway: hex shows every byte up to the limit
		}
		shown = b[:cut]
	}
	if printable(shown) {
		p.Encoding, p.Text = "utf-8", string(shown)
		return p
	}
	if len(shown) > limit/2 { // hex takes two characters a byte
		shown = shown[:limit/2]
		p.Truncated = true
	}
	p.Encoding, p.Text = "hex", hex.EncodeToString(shown)
	return p
}

// printable reports whether b is UTF-8 made only of printable characters
// (unicode.IsPrint), tabs and newlines.
func printable(b []byte) bool {
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size <= 1 {
			return false
		}
		if !unicode.IsPrint(r) && r != '\n' && r != '\t' && r != '\r' {
			return false
		}
		b = b[size:]
	}
	return true
}

// visible returns s with every character that is neither printable nor a
// tab or newline written as a Go escape (\x00, \u202e): for text that
// comes from handlers, such as a dead letter's error, which may quote a
// message's bytes.
func visible(s string) string {
	if printable([]byte(s)) {
		return s
	}
	var out []byte
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			out = fmt.Appendf(out, `\x%02x`, s[i])
		case unicode.IsPrint(r) || r == '\n' || r == '\t' || r == '\r':
			out = utf8.AppendRune(out, r)
		default:
			q := strconv.QuoteRuneToASCII(r)
			out = append(out, q[1:len(q)-1]...)
		}
	}
	return string(out)
}

// escaped is s as a Go string literal when it is not printable UTF-8 (see
// printable), for the JSON's _escaped fields; "" when s shows as it is.
func escaped(s string) string {
	if printable([]byte(s)) {
		return ""
	}
	return strconv.Quote(s)
}
