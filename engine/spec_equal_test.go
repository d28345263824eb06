package engine

import (
	"reflect"
	"testing"
	"time"
)

// GroupSpec.Equal is written by hand; a group's options are compared with
// it (Subscribe refuses options that differ from the group's). So every
// field, down to the fields of the structs it holds, must count: a spec
// that differs from another in any one of them is not Equal to it. The
// fields are found by reflection, so an option added to GroupSpec fails
// this until Equal compares it.
func TestGroupSpecEqualComparesEveryField(t *testing.T) {
	var zero GroupSpec
	if !zero.Equal(zero) {
		t.Fatal("the zero GroupSpec is not Equal to itself")
	}
	var leaves []string
	var walk func(typ reflect.Type, index []int, path string)
	walk = func(typ reflect.Type, index []int, path string) {
		if typ.Kind() == reflect.Struct && typ != reflect.TypeFor[time.Time]() {
			for i := range typ.NumField() {
				walk(typ.Field(i).Type, append(index[:len(index):len(index)], i), path+"."+typ.Field(i).Name)
			}
			return
		}
		leaves = append(leaves, path)
		var s GroupSpec
		leaf := reflect.ValueOf(&s).Elem().FieldByIndex(index)
		switch leaf.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			leaf.SetInt(2) // not 1: KeyConcurrency 1 is its zero's meaning
		case reflect.Float32, reflect.Float64:
			leaf.SetFloat(1.5)
		case reflect.Bool:
			leaf.SetBool(true)
		case reflect.String:
			leaf.SetString("x")
		case reflect.Struct: // time.Time
			leaf.Set(reflect.ValueOf(time.Unix(1, 0)))
		default:
			t.Fatalf("GroupSpec%s is a %v: teach this test to vary it", path, leaf.Kind())
		}
		if s.Equal(zero) || zero.Equal(s) {
			t.Errorf("GroupSpec%s: a spec that differs only there is Equal to the zero spec; Equal must compare it", path)
		}
		if !s.Equal(s) {
			t.Errorf("GroupSpec%s: a spec is not Equal to itself", path)
		}
	}
	walk(reflect.TypeFor[GroupSpec](), nil, "")
	if len(leaves) < 7 {
		t.Errorf("varied %d fields (%v); want every one", len(leaves), leaves)
	}
	// Times are compared as instants, whatever their location.
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	if a, b := (GroupSpec{Start: Start{Kind: StartTime, Time: at}}), (GroupSpec{Start: Start{Kind: StartTime, Time: at.In(time.FixedZone("x", 3600))}}); !a.Equal(b) {
		t.Error("two specs starting at the same instant in different locations are not Equal")
	}
	// KeyConcurrency 0 is 1: a spec stored before the field existed (an
	// engine that keeps specs on a server) equals a resolved one.
	if !(GroupSpec{}).Equal(GroupSpec{KeyConcurrency: 1}) {
		t.Error("KeyConcurrency 0 and 1 are not Equal")
	}
}
