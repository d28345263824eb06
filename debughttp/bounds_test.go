package debughttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/debughttp"
	"github.com/logbus/logbus/pubsub"
)

// A topic of many partitions makes no page large: the overview lists no
// partition, a topic's and a group's views list 256 at a time with a link
// to the next, and each consumer's partitions are cut at 64, with the
// counts in full beside them.
func TestManyPartitionsArePaged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const partitions = 4096
		b := pubsub.NewBroker()
		t.Cleanup(func() { _ = b.Close(context.Background()) })
		wide, err := pubsub.NewTopic(b, "wide", codec.String(), codec.String(), pubsub.WithPartitions(partitions),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 4}))
		if err != nil {
			t.Fatal(err)
		}
		ok := pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil })
		for _, g := range []string{"a", "b"} {
			for _, c := range []string{"1", "2"} {
				if _, err := wide.Subscribe(g, g+"-"+c, ok); err != nil {
					t.Fatal(err)
				}
			}
		}
		synctest.Wait()
		h := debughttp.Handler(b)

		for path, limit := range map[string]int{
			"/": 16 << 10, "/?format=json": 16 << 10,
			"/topics/wide": 96 << 10, "/topics/wide?format=json": 64 << 10,
			"/topics/wide/groups/a": 128 << 10, "/topics/wide/groups/a?format=json": 96 << 10,
		} {
			r := get(t, h, path)
			if page := body(t, r); r.StatusCode != http.StatusOK || len(page) > limit {
				t.Errorf("GET %s: %d, %d bytes, want 200 and at most %d", path, r.StatusCode, len(page), limit)
			}
		}

		o := decode[overview](t, get(t, h, "/?format=json"))
		if tv := o.Topics[0]; tv.NumPartitions != partitions || tv.Partitions != nil {
			t.Errorf("the overview's topic: %d partitions, %d listed; want %d, none listed", tv.NumPartitions, len(tv.Partitions), partitions)
		}
		type paged struct {
			NumPartitions int `json:"num_partitions"`
			Partitions    []struct {
				Partition int `json:"partition"`
			} `json:"partitions"`
			Page      struct{ First, Shown, Next int } `json:"page"`
			Consumers []consumer                       `json:"consumers"`
		}
		for _, view := range []string{"/topics/wide", "/topics/wide/groups/a"} {
			next, pages := 0, 0
			for {
				p := decode[paged](t, get(t, h, fmt.Sprintf("%s?format=json&first=%d", view, next)))
				pages++
				if p.NumPartitions != partitions || p.Page.First != next || len(p.Partitions) != p.Page.Shown || p.Page.Shown > 256 ||
					len(p.Partitions) == 0 || p.Partitions[0].Partition != next {
					t.Fatalf("%s from %d: %d partitions of %d, page %+v", view, next, len(p.Partitions), p.NumPartitions, p.Page)
				}
				if p.Page.Next == 0 {
					break
				}
				next = p.Page.Next
			}
			if pages != partitions/256 {
				t.Errorf("%s: %d pages, want %d", view, pages, partitions/256)
			}
			if r := get(t, h, view+"?first=4096"); r.StatusCode != http.StatusBadRequest {
				t.Errorf("%s?first=4096: %d, want 400", view, r.StatusCode)
			}
		}
		page := body(t, get(t, h, "/topics/wide/groups/a?first=256"))
		if !strings.Contains(page, `Partitions 256–511 of 4096 · <a href="?first=0" rel="prev">previous</a> · <a href="?first=512" rel="next">next</a>`) {
			t.Error("the group's second page of partitions has no links to the others")
		}
		g := decode[paged](t, get(t, h, "/topics/wide/groups/a?format=json"))
		for _, c := range g.Consumers {
			if c.NumPartitions != partitions/2 || len(c.Partitions) != 64 {
				t.Errorf("consumer %s: %d partitions listed of %d, want 64 of %d", c.Name, len(c.Partitions), c.NumPartitions, partitions/2)
			}
		}
		if page := body(t, get(t, h, "/")); !strings.Contains(page, `(2048 partitions)`) {
			t.Error("the overview does not say how many partitions a consumer owns")
		}
	})
}

// A dead letter's error is cut at 1 KiB, saying so, and with WithPayloads
// its headers are cut at 32, each name at 128 bytes.
func TestDeadLetterErrorsAndHeadersAreCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsub.NewBroker()
		t.Cleanup(func() { _ = b.Close(context.Background()) })
		topic, err := pubsub.NewTopic(b, "t", codec.String(), codec.String())
		if err != nil {
			t.Fatal(err)
		}
		long := strings.Repeat("é", 1<<19) // 1 MiB
		if _, err := topic.Subscribe("g", "c", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
			return errors.Join(errors.New(long), pubsub.ErrPermanent)
		})); err != nil {
			t.Fatal(err)
		}
		headers := map[string]string{}
		for i := range 1000 {
			headers[fmt.Sprintf("%04d-%s", i, strings.Repeat("k", 1000))] = strings.Repeat("v", 1000)
		}
		if _, err := topic.Publish(t.Context(), "k", "v", pubsub.WithHeaders(headers)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		for _, h := range []http.Handler{debughttp.Handler(b), debughttp.Handler(b, debughttp.WithPayloads())} {
			for _, path := range []string{"/", "/topics/t/groups/g"} {
				page := body(t, get(t, h, path))
				if len(page) > 32<<10 || !strings.Contains(page, "truncated: 1048594 B in all") {
					t.Errorf("GET %s: %d bytes, want at most 32 KiB, saying the error was truncated", path, len(page))
				}
				r := get(t, h, path+"?format=json")
				if json := body(t, r); len(json) > 64<<10 {
					t.Errorf("GET %s as JSON: %d bytes, want at most 64 KiB", path, len(json))
				}
			}
		}
		type letterJSON struct {
			Error            string            `json:"error"`
			ErrorSize        int               `json:"error_size"`
			ErrorTruncated   bool              `json:"error_truncated"`
			NumHeaders       int               `json:"num_headers"`
			Headers          map[string]string `json:"headers"`
			HeadersTruncated bool              `json:"headers_truncated"`
		}
		g := decode[struct {
			DeadLetters []letterJSON `json:"dead_letters"`
		}](t, get(t, debughttp.Handler(b, debughttp.WithPayloads()), "/topics/t/groups/g?format=json"))
		l := g.DeadLetters[0]
		if len(l.Error) > 1024 || !strings.HasPrefix(l.Error, "éé") || !l.ErrorTruncated || l.ErrorSize != len(long)+len("\npermanent failure") {
			t.Errorf("error: %d bytes shown of %d, truncated %v; want 1 KiB at most, truncated", len(l.Error), l.ErrorSize, l.ErrorTruncated)
		}
		if l.NumHeaders != 1000 || len(l.Headers) != 32 || !l.HeadersTruncated {
			t.Errorf("headers: %d shown of %d, truncated %v; want 32 of 1000, truncated", len(l.Headers), l.NumHeaders, l.HeadersTruncated)
		}
		for k, v := range l.Headers {
			if len(k) > 128+len("…") || len(v) > 256+len("…") || !strings.HasSuffix(k, "…") {
				t.Errorf("header %.20s…: name %d bytes, value %d, want them cut at 128 and 256", k, len(k), len(v))
			}
		}
	})
}

// The views read a group's newest dead letters only (20 by default), not
// a copy of its whole queue: with 4096 letters of 4 KiB held (16 MiB), one
// view allocates far less than the queue.
func TestDeadLetterViewsReadOnlyTheNewest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const letters, size = 4096, 4 << 10
		b := pubsub.NewBroker()
		t.Cleanup(func() { _ = b.Close(context.Background()) })
		topic, err := pubsub.NewTopic(b, "t", codec.String(), codec.Bytes(), pubsub.WithRetention(pubsub.Retention{MaxMessages: letters}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := topic.Subscribe("g", "c", pubsub.HandlerFunc[[]byte](func(context.Context, pubsub.Message[[]byte]) error {
			return pubsub.ErrPermanent
		}), pubsub.WithDeadLetterLimit(letters)); err != nil {
			t.Fatal(err)
		}
		value := make([]byte, size)
		for i := range letters {
			if _, err := topic.Publish(t.Context(), fmt.Sprint(i), value); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		h := debughttp.Handler(b)
		for _, path := range []string{"/?format=json", "/topics/t/groups/g?format=json", "/", "/topics/t/groups/g"} {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			r := get(t, h, path)
			runtime.ReadMemStats(&after)
			if r.StatusCode != http.StatusOK {
				t.Fatalf("GET %s: %d", path, r.StatusCode)
			}
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("GET %s allocated %d KiB", path, alloc>>10)
			if alloc > 2<<20 {
				t.Errorf("GET %s allocated %d KiB, want under 2 MiB: the queue holds %d KiB", path, alloc>>10, letters*size>>10)
			}
		}
		g := decode[group](t, get(t, h, "/topics/t/groups/g?format=json"))
		if g.NumDead != letters || len(g.DeadLetters) != 20 || g.DeadLetters[0].Offset != letters-1 || g.DeadLetters[19].Offset != letters-20 {
			t.Errorf("the group's view: %d letters of %d, want the newest 20 of %d, newest first", len(g.DeadLetters), g.NumDead, letters)
		}
	})
}
