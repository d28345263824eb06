package debughttp

import (
	"maps"
	"slices"
	"strings"

	"github.com/logbus/logbus/pubsub"
)

// redacted is what a redacted header's value reads.
const redacted = "[redacted]"

// letter is what the pages show of l: its bytes previewed only with
// WithPayloads, its secret headers redacted even then.
func (c *config) letter(l pubsub.DeadLetter[[]byte]) letterView {
	lv := letterView{ID: l.Message.ID, Partition: l.Message.Partition, Offset: l.Message.Offset, Attempts: l.Attempts,
		FailedAt: l.FailedAt, Created: l.Message.Created, NumHeaders: len(l.Message.Headers),
		Key: preview{Size: len(l.Message.Key)}, Value: preview{Size: len(l.Message.Value)}}
	for k, v := range l.Message.Headers {
		lv.HeaderBytes += len(k) + len(v)
	}
	if l.Err != nil {
		lv.Error = visible(l.Err.Error())
	}
	if !c.payloads {
		return lv
	}
	lv.Key, lv.Value = newPreview(l.Message.Key, previewLimit), newPreview(l.Message.Value, previewLimit)
	if len(l.Message.Headers) > 0 {
		lv.Headers = make(map[string]string, len(l.Message.Headers))
		for _, k := range slices.Sorted(maps.Keys(l.Message.Headers)) {
			v := l.Message.Headers[k]
			switch {
			case c.redact[strings.ToLower(k)]:
				v = redacted
			case len(v) > previewLimit:
				v = strings.ToValidUTF8(v[:previewLimit], "") + "…"
			}
			lv.Headers[visible(k)] = visible(v)
		}
	}
	return lv
}
