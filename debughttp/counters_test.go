package debughttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/logbus/logbus/pubsub"
)

// fixedSource shows a snapshot made up by a test.
type fixedSource struct{ snap pubsub.Snapshot }

func (s fixedSource) snapshot() pubsub.Snapshot { return s.snap }

func (fixedSource) letters(context.Context, string, string, int) ([]pubsub.DeadLetter[[]byte], error) {
	return nil, nil
}

func (fixedSource) act(context.Context, action) (int, error) { return 0, errors.New("read-only") }

// distinct sets every field of the struct s points to a value of its own,
// from base on, and returns them by field name.
func distinct(s any, base int64) map[string]int64 {
	v := reflect.ValueOf(s).Elem()
	out := map[string]int64{}
	for i := range v.NumField() {
		v.Field(i).SetInt(base + int64(i))
		out[v.Type().Field(i).Name] = base + int64(i)
	}
	return out
}

// Every counter of pubsub.TopicStats and pubsub.GroupStats is on the debug
// page: under its key in the JSON (the key topicCounters or groupCounters
// gives it), and in the HTML (the topics table of the overview, the
// group's own page). The counters are read by reflection, so one added to
// either struct fails this until the page shows it.
func TestEveryCounterIsShown(t *testing.T) {
	var ts pubsub.TopicStats
	var gs pubsub.GroupStats
	topicWant := distinct(&ts, 1_000_001)
	groupWant := distinct(&gs, 2_000_001)
	snap := pubsub.Snapshot{Topics: []pubsub.TopicSnapshot{{
		Name: "orders", Stats: ts, Partitions: []pubsub.PartitionSnapshot{{}},
		Groups: []pubsub.GroupSnapshot{{Name: "billing", Stats: gs, Partitions: []pubsub.GroupPartitionSnapshot{{}}}},
	}}}
	h := newHandler(fixedSource{snap})
	get := func(path string) string {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body)
		}
		return rec.Body.String()
	}
	check := func(what string, mirror reflect.Type, want map[string]int64, jsonPath, htmlPath string, pick func(map[string]any) map[string]any) {
		var doc map[string]any
		if err := json.Unmarshal([]byte(get(jsonPath)), &doc); err != nil {
			t.Fatal(err)
		}
		obj, page := pick(doc), get(htmlPath)
		for name, v := range want {
			f, ok := mirror.FieldByName(name)
			key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !ok || key == "" {
				t.Errorf("%s.%s has no JSON key in %v", what, name, mirror)
				continue
			}
			if got, ok := obj[key].(float64); !ok || int64(got) != v {
				t.Errorf("%s.%s: JSON %q = %v, want %d", what, name, key, obj[key], v)
			}
			if !regexp.MustCompile(`\b` + fmt.Sprint(v) + `\b`).MatchString(page) {
				t.Errorf("%s.%s (%d) is not on the page %s", what, name, v, htmlPath)
			}
		}
	}
	check("TopicStats", reflect.TypeFor[topicCounters](), topicWant, "/?format=json", "/?format=html",
		func(doc map[string]any) map[string]any { return doc["topics"].([]any)[0].(map[string]any) })
	check("GroupStats", reflect.TypeFor[groupCounters](), groupWant, "/topics/orders/groups/billing?format=json",
		"/topics/orders/groups/billing?format=html", func(doc map[string]any) map[string]any { return doc })
}
