package config

import (
	"reflect"
	"strings"
	"time"
)

// Key is one key of the configuration file, as its schema (Config's toml
// tags) declares it.
type Key struct {
	// Path is the key as a TOML file writes it under its tables:
	// "limits.nop_timeout", "target.lun.size" ([[target.lun]]'s size).
	Path string
	// Type says what it takes: "string", "integer", "boolean",
	// "duration (a string such as \"15s\")", "size (a string such as
	// \"64MiB\")", "list of strings", "table", "array of tables".
	Type string
}

// Keys lists every key of the configuration file, tables before the keys
// inside them, in the order Config declares them.
func Keys() []Key {
	var out []Key
	walk(reflect.TypeOf(Config{}), "", &out)
	return out
}

// sizeKey reports whether a string key takes a size.
func sizeKey(name string) bool {
	switch name {
	case "size", "io_budget", "session_io_budget", "rdma_memory":
		return true
	}
	return false
}

func walk(t reflect.Type, prefix string, out *[]Key) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "" || name == "-" || !f.IsExported() {
			continue
		}
		path := prefix + name
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft == reflect.TypeOf(time.Duration(0)):
			*out = append(*out, Key{path, `duration (a string such as "15s")`})
		case ft.Kind() == reflect.Struct:
			*out = append(*out, Key{path, "table"})
			walk(ft, path+".", out)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			*out = append(*out, Key{path, "array of tables"})
			walk(ft.Elem(), path+".", out)
		case ft.Kind() == reflect.Slice:
			*out = append(*out, Key{path, "list of strings"})
		case ft.Kind() == reflect.Bool:
			*out = append(*out, Key{path, "boolean"})
		case ft.Kind() == reflect.String && sizeKey(name):
			*out = append(*out, Key{path, `size (a string such as "64MiB")`})
		case ft.Kind() == reflect.String:
			*out = append(*out, Key{path, "string"})
		default:
			*out = append(*out, Key{path, "integer"})
		}
	}
}
