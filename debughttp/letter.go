package debughttp

import (
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/logbus/logbus/pubsub"
)

// redacted is what a redacted header's value reads.
const redacted = "[redacted]"

// letter is what the pages show of l: its error's first errorLimit bytes;
// its bytes previewed only with [WithPayloads], its secret headers redacted
// even then.
func (c *config) letter(l pubsub.DeadLetter[[]byte]) letterView {
	lv := letterView{ID: l.Message.ID, Partition: l.Message.Partition, Offset: l.Message.Offset, Attempts: l.Attempts,
		FailedAt: l.FailedAt, Created: l.Message.Created, NumHeaders: len(l.Message.Headers),
		Key: preview{Size: len(l.Message.Key)}, Value: preview{Size: len(l.Message.Value)}}
	for k, v := range l.Message.Headers {
		lv.HeaderBytes += len(k) + len(v)
	}
	if l.Err != nil {
		e := l.Err.Error()
		lv.ErrorSize = len(e)
		e, lv.ErrorTruncated = cut(e, errorLimit)
		lv.Error = visible(e)
	}
	if !c.payloads {
		return lv
	}
	lv.Key, lv.Value = newPreview(l.Message.Key, previewLimit), newPreview(l.Message.Value, previewLimit)
	if len(l.Message.Headers) == 0 {
		return lv
	}
	names := slices.Sorted(maps.Keys(l.Message.Headers))
	lv.HeadersTruncated = len(names) > headerLimit
	lv.Headers = make(map[string]string, min(len(names), headerLimit))
	for _, k := range names[:min(len(names), headerLimit)] {
		v := redacted
		if !c.redact[strings.ToLower(k)] {
			v = ellipsis(cut(l.Message.Headers[k], previewLimit))
		}
		lv.Headers[visible(ellipsis(cut(k, headerKeyLimit)))] = visible(v)
	}
	return lv
}

// cut returns the first limit bytes of s or fewer, never splitting a
// character of valid UTF-8, and whether it cut anything.
func cut(s string, limit int) (string, bool) {
	if len(s) <= limit {
		return s, false
	}
	i := limit
	for i > 0 && limit-i < utf8.UTFMax && !utf8.RuneStart(s[i]) {
		i--
	}
	if i == 0 || limit-i >= utf8.UTFMax {
		i = limit // not UTF-8 there: cut at the limit
	}
	return s[:i], true
}

// ellipsis marks a cut string with "…".
func ellipsis(s string, cut bool) string {
	if cut {
		return s + "…"
	}
	return s
}
