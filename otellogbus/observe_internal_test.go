package otellogbus

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strings"
	"testing"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// checkTable checks that table has one line per field of S, by
// reflection: each line's value is called on an S whose fields all differ,
// and must read a field no other line reads. So a counter added to
// pubsub.TopicStats or GroupStats fails this until it has a line. A line
// is exported under a name with one of prefixes, a unit and a
// description, or says which instrument measures it instead.
func checkTable[S any](t *testing.T, table []stat[S], prefixes ...string) map[string]stat[S] {
	t.Helper()
	var s S
	v := reflect.ValueOf(&s).Elem()
	field := map[int64]string{}
	for i := range v.NumField() {
		v.Field(i).SetInt(int64(1000 + i))
		field[int64(1000+i)] = v.Type().Field(i).Name
	}
	byField := map[string]stat[S]{}
	for i, st := range table {
		name, ok := field[st.value(s)]
		if !ok {
			t.Errorf("%T line %d reads no field of its own", s, i)
			continue
		}
		if _, twice := byField[name]; twice {
			t.Errorf("%T.%s has two lines", s, name)
		}
		byField[name] = st
		switch {
		case st.name == "" && st.measuredBy == "":
			t.Errorf("%T.%s: neither exported nor measured elsewhere", s, name)
		case st.name != "" && st.measuredBy != "":
			t.Errorf("%T.%s: exported as %s and said to be measured by %s", s, name, st.name, st.measuredBy)
		case st.name != "" && (st.unit == "" || st.desc == ""):
			t.Errorf("%T.%s: %s has no unit or no description", s, name, st.name)
		case st.name != "" && !slicesHasPrefix(st.name, prefixes):
			t.Errorf("%T.%s: %s is not named like the others (%s…)", s, name, st.name, strings.Join(prefixes, "…, "))
		}
	}
	for i := range v.NumField() {
		if name := v.Type().Field(i).Name; byField[name].value == nil {
			t.Errorf("%T.%s has no line in the table: export it from Observe (or say what measures it)", s, name)
		}
	}
	return byField
}

func slicesHasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// Every counter of pubsub.TopicStats and GroupStats has a line in
// Observe's tables, and each line is in Observe's doc comment: its
// instrument's name, unit and field, or, for a counter the hooks already
// measure, the field and that instrument.
func TestEveryCounterIsExported(t *testing.T) {
	doc := observeDoc(t)
	for field, st := range checkTable(t, topicStats, "logbus.records.", "logbus.producer.") {
		checkDoc(t, doc, "TopicStats", field, st.name, st.unit, st.measuredBy)
	}
	for field, st := range checkTable(t, groupStats, "logbus.consumer.") {
		checkDoc(t, doc, "GroupStats", field, st.name, st.unit, st.measuredBy)
	}
}

func checkDoc(t *testing.T, doc, of, field, name, unit, measuredBy string) {
	t.Helper()
	if name == "" {
		by, _, _ := strings.Cut(measuredBy, ",")
		if !strings.Contains(doc, of+"."+field) || !strings.Contains(doc, by) {
			t.Errorf("Observe's doc does not say that %s.%s is measured by %s", of, field, by)
		}
		return
	}
	if !strings.Contains(doc, name+" "+unit) && !strings.Contains(doc, name+" ("+unit+")") || !strings.Contains(doc, "("+field+")") {
		t.Errorf("Observe's doc does not list %s %s (%s.%s)", name, unit, of, field)
	}
}

// observeDoc is the doc comment of Hooks.Observe, its lines joined by
// spaces.
func observeDoc(t *testing.T) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "observe.go", nil, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == "Observe" && fd.Doc != nil {
			return strings.Join(strings.Fields(fd.Doc.Text()), " ")
		}
	}
	t.Fatal("no doc comment on Observe in observe.go")
	return ""
}

// Each line of the tables is collected from a broker under its name and
// unit, as a counter or, for a level, a gauge.
func TestEveryLineIsCollected(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	h := New(WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	b := pubsub.NewBroker()
	defer func() {
		if err := b.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := topic.Subscribe("billing", "b1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil })); err != nil {
		t.Fatal(err)
	}
	reg, err := h.Observe(b)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	kind := map[string]string{} // name and unit -> "counter" or "gauge"
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Data.(type) {
			case metricdata.Sum[int64]:
				kind[m.Name+" "+m.Unit] = "counter"
			case metricdata.Gauge[int64]:
				kind[m.Name+" "+m.Unit] = "gauge"
			}
		}
	}
	want := func(name, unit string, gauge bool) {
		if name == "" {
			return
		}
		w := "counter"
		if gauge {
			w = "gauge"
		}
		if got := kind[name+" "+unit]; got != w {
			t.Errorf("%s %s collected as %q, want a %s; collected: %v", name, unit, got, w, kind)
		}
	}
	for _, st := range topicStats {
		want(st.name, st.unit, st.gauge)
	}
	for _, st := range groupStats {
		want(st.name, st.unit, st.gauge)
	}
}
