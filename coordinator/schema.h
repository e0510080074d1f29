/*
 * coordinator/schema — JSON Schema to grammar: the text of a grammar (model/grammar.h) whose
 * sentences are JSON documents valid under a schema, for response_format json_schema /
 * json_object and for tool calls. The supported subset, and how each keyword becomes grammar, is
 * in docs/http-api.md ("Structured output: the JSON Schema subset"); everything else is refused
 * with an error naming the keyword and its path, never ignored (only the purely descriptive
 * keywords are: title, description, $schema, $id, $comment, examples, default, deprecated,
 * readOnly, writeOnly).
 *
 * The grammar is a generator's, not a validator's: it accepts one spelling of each document
 * family, a subset of what a validator accepts.
 *   - Object keys come in the schema's "properties" order; required ones must appear, optional
 *     ones may be left out. An object schema WITH properties is closed: additionalProperties
 *     absent or true is taken as false (a generator needs a closed key set). Without properties
 *     it is any object (additionalProperties absent/true) or one whose values follow the
 *     additionalProperties schema.
 *   - Whitespace between tokens is bounded: nothing, one space, or a newline and up to 20 spaces
 *     or tabs; after the document, the same; none before it.
 *   - Numbers: at most 15 integer digits, 15 fraction digits and 3 exponent digits; integers
 *     have no fraction or exponent; bounded numbers (minimum...) no exponent.
 *   - A schema without "type" whose keywords belong to some types (properties: object, items:
 *     array, maxLength: string, minimum: number) is taken as those types.
 * Errors are "path.keyword: what", e.g. "properties.age.multipleOf: not supported", and exactly
 * "out of memory" when an allocation failed.
 */
#ifndef OROCHI_SCHEMA_H
#define OROCHI_SCHEMA_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* Grammar text (malloc'd) whose sentences are the JSON texts valid under the schema; NULL with
 * err = what is unsupported or wrong, naming the schema path. */
char *schema_to_grammar(const cJSON *schema, char *err, size_t errlen);

/* Grammar text (malloc'd) of any JSON object (response_format json_object); NULL when out of
 * memory. */
char *schema_json_object_grammar(void);

/* Grammar text (malloc'd) of a tool call: the JSON object {"name": "<fn>", "arguments": {...}}
 * (in that layout) whose arguments follow the function's "parameters" schema. tools is the
 * OpenAI tools array ([{"type": "function", "function": {"name", "description", "parameters"}}]);
 * only_name NULL: any of the functions, else just that one. NULL with err naming tools[i]...
 * when a tool is malformed or unsupported, or no function is named only_name. */
char *schema_tool_call_grammar(const cJSON *tools, const char *only_name, char *err, size_t errlen);

#endif
