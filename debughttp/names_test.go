package debughttp_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/debughttp"
	"github.com/logbus/logbus/pubsub"
)

// Topic, group and consumer names are shown as errors are: a bidi
// override (U+202E) in any of them reaches no page raw, in the tables,
// the titles, the stuck list or the dead letters.
func TestNamesAreShownEscaped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsub.NewBroker(pubsub.WithStuckAfter(100 * time.Millisecond))
		topicName, groupName, stuckName, consumer := "pay\u202eslip", "bill\u202eing", "mail\u202eer", "worker\u202e-1"
		topic, err := pubsub.NewTopic(b, topicName, codec.String(), codec.String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := topic.Subscribe(groupName, consumer, pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
			return pubsub.ErrPermanent
		})); err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		if _, err := topic.Subscribe(stuckName, consumer, pubsub.HandlerFunc[string](func(ctx context.Context, _ pubsub.Message[string]) error {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		})); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			close(release)
			_ = b.Close(context.Background())
		})
		if _, err := topic.Publish(t.Context(), "k", "v"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // virtual: past the stuck threshold
		synctest.Wait()

		h := debughttp.Handler(b, debughttp.WithActions())
		tp, gp, sp := "/topics/"+url.PathEscape(topicName), "/groups/"+url.PathEscape(groupName), "/groups/"+url.PathEscape(stuckName)
		for _, path := range []string{"/", tp, tp + gp, tp + sp, tp + gp + "?first=0"} {
			r := get(t, h, path)
			page := body(t, r)
			if r.StatusCode != http.StatusOK {
				t.Fatalf("GET %s: %d", path, r.StatusCode)
			}
			if strings.Contains(page, "\u202e") {
				t.Errorf("GET %s shows a raw U+202E", path)
			}
			if !strings.Contains(page, `pay\u202eslip`) {
				t.Errorf("GET %s does not show the topic's name escaped", path)
			}
		}
		overview := body(t, get(t, h, "/"))
		for _, want := range []string{`<table id="stuck">`, `bill\u202eing`, `mail\u202eer`, `worker\u202e-1`} {
			if !strings.Contains(overview, want) {
				t.Errorf("the overview lacks %s", want)
			}
		}
	})
}

// Names that are not valid UTF-8 stay distinct in the JSON: encoding/json
// writes both orders\xff and orders\xfe as "orders\ufffd", so each gets an
// escaped field beside it; a printable name gets none.
func TestInvalidUTF8NamesStayDistinctInJSON(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsub.NewBroker()
		t.Cleanup(func() { _ = b.Close(context.Background()) })
		ok := pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil })
		for _, name := range []string{"orders", "orders\xff", "orders\xfe"} {
			topic, err := pubsub.NewTopic(b, name, codec.String(), codec.String())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := topic.Subscribe("g\xff", "c\xfe", ok); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		h := debughttp.Handler(b)
		type named struct {
			Name         string `json:"name"`
			NameEscaped  string `json:"name_escaped"`
			TopicEscaped string `json:"topic_escaped"`
			Consumers    []struct {
				NameEscaped string `json:"name_escaped"`
			} `json:"consumers"`
			Partitions []struct {
				OwnerEscaped string `json:"owner_escaped"`
			} `json:"partitions"`
			Groups []named `json:"groups"`
		}
		o := decode[struct {
			Topics []named `json:"topics"`
		}](t, get(t, h, "/?format=json"))
		var got []string
		for _, tv := range o.Topics {
			got = append(got, tv.Name+" "+tv.NameEscaped)
		}
		want := []string{"orders ", "orders\uFFFD \"orders\\xfe\"", "orders\uFFFD \"orders\\xff\""}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("topics in the JSON: %q, want %q", got, want)
		}
		g := decode[named](t, get(t, h, "/topics/"+url.PathEscape("orders\xfe")+"/groups/"+url.PathEscape("g\xff")+"?format=json"))
		if g.NameEscaped != `"g\xff"` || g.TopicEscaped != `"orders\xfe"` || len(g.Consumers) != 1 || g.Consumers[0].NameEscaped != `"c\xfe"` ||
			len(g.Partitions) != 1 || g.Partitions[0].OwnerEscaped != `"c\xfe"` {
			t.Errorf("the group's JSON: %+v, want its names escaped beside them", g)
		}
	})
}
