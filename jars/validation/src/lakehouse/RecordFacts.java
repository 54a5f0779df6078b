package lakehouse;

import java.io.IOException;
import java.io.StringWriter;
import java.io.UncheckedIOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.time.ZoneOffset;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.Map;
import java.util.TreeMap;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.catalyst.expressions.variant.VariantCastArgs;
import org.apache.spark.sql.catalyst.expressions.variant.VariantGet$;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.types.variant.Variant;
import org.apache.spark.types.variant.VariantBuilder;
import org.apache.spark.types.variant.VariantUtil;
import scala.Option;

/**
 * What silver's validation needs to know of one bronze record, read in one pass: whether it
 * is JSON, whether an object and of how many fields, and per contract field its JSON kind
 * and its text, the fields the contract does not name as JSON text, and whether it holds
 * U+FFFD, bronze's mark for bytes that were not UTF-8 (spark_jobs/silver/validation.py,
 * which declares the struct returned).
 *
 * <p>The answers are Spark's own, computed with Spark's own code: the record is parsed as
 * {@code try_parse_json} parses it ({@code VariantBuilder}, the session's settings for
 * duplicate keys and Unicode), and every value that is not a JSON string is converted as
 * {@code try_variant_get} converts it ({@code VariantGet.cast}). What this saves is the way
 * there: built-in expressions take each field out of a map of variants and then build a
 * literal, a cast and a configuration for every scalar (a fifth to a quarter of silver's
 * validation, profiled); here a string is read straight from the variant. And the fields
 * the contract does not name come out as {@code to_json(map_filter(...))} writes them, with
 * the same JSON generator, where a higher-order function kept Spark from compiling the
 * whole validation into one method (a third of its time).
 *
 * <p>Most records need less: an object whose fields are each a JSON string or null (or, for
 * {@code event_time}, an integer). Those are read from the parser's tokens
 * ({@link #plainRecord}), the same tokens of the same parser {@code VariantBuilder} would
 * build the variant from, without building it; every other record (any other value, a key
 * twice, a surrogate, anything the parser refuses) takes the variant's way. That includes
 * the contract's longest records, which a field it does not name makes up to 1 MiB: half
 * the bytes of the bench's corpus, built into a variant and written back out as JSON.
 *
 * <p>The record comes as its UTF-8 bytes ({@code raw} cast to binary), not as a Java string.
 * A plain record of ASCII without an escape, nearly every record a producer writes, is read
 * by a scan of its bytes ({@link #asciiRecord}) that accepts only what JSON spells one way
 * (strings without a backslash, {@code null}, digits), where the bytes are the characters
 * and a value's text is the bytes between its quotes. Any other record is decoded as Spark
 * decodes a string for a Java function ({@code UTF8String.toString}) and read with Jackson,
 * so no answer depends on how a parser treats bytes that are not UTF-8.
 */
public final class RecordFacts implements UDF1<byte[], Row> {

    /** The contract's fields, in the order of the struct's per-field columns. */
    static final String[] FIELDS = {"event_id", "event_time", "event_type", "ad_id", "user_id",
        "page_id", "ad_type", "ip_address", "price"};
    static final int EVENT_TIME = 1;
    static final int PRICE = 8;
    /** Each contract field's place in {@link #FIELDS}. */
    private static final Map<String, Integer> FIELD_INDEX = new HashMap<>();
    static {
        for (int i = 0; i < FIELDS.length; i++) {
            FIELD_INDEX.put(FIELDS[i], i);
        }
    }
    private static final JsonFactory JSON = new JsonFactory();

    static final String STRING = "STRING";
    static final String NUMBER = "NUMBER";
    static final String JSON_NULL = "VOID";  // schema_of_variant's name for it

    private static final DataType PRICE_TYPE = DataTypes.createDecimalType(38, 8);

    /** The struct's width: is_json, fields, known; kind and text per field; then
     * event_time_number, price_number, unknown_fields and marked_invalid. */
    private static final int FACTS = 3 + 2 * FIELDS.length + 4;
    private static final int EVENT_TIME_NUMBER = 3 + 2 * FIELDS.length;
    private static final int PRICE_NUMBER = EVENT_TIME_NUMBER + 1;
    private static final int UNKNOWN_FIELDS = EVENT_TIME_NUMBER + 2;
    private static final int MARKED_INVALID = EVENT_TIME_NUMBER + 3;

    /** What bronze puts where a record's bytes were not UTF-8 (its split of a landed file
     * into lines decodes them, {@code make_valid_utf8} a Kafka message's). */
    private static final char REPLACEMENT = '\uFFFD';

    /** Where field {@code i}'s kind is in the struct; its text is just after. */
    private static int kindAt(int i) {
        return 3 + 2 * i;
    }

    /** A record longer than this takes the variant's way, which knows its size limits. */
    private static final int PLAIN_AT_MOST = 1 << 20;

    private static final EnumSet<JsonParser.NumberType> WITHIN_A_LONG =
        EnumSet.of(JsonParser.NumberType.INT, JsonParser.NumberType.LONG);

    private final boolean allowDuplicateKeys;
    private final boolean validateUnicode;

    public RecordFacts() {
        // Read where the function is registered, as the built-in expression reads them
        // where it is planned.
        SQLConf conf = SQLConf.get();
        allowDuplicateKeys = (Boolean) conf.getConf(SQLConf.VARIANT_ALLOW_DUPLICATE_KEYS());
        validateUnicode = (Boolean) conf.getConf(
            SQLConf.VARIANT_VALIDATE_UNICODE_IN_JSON_PARSING());
    }

    @Override
    public Row call(byte[] raw) {
        if (raw == null) {
            return answer(variantFacts(null), false);
        }
        Object[] scanned = isAscii(raw) ? asciiRecord(raw) : null;
        if (scanned != null && scanned != NOT_PLAIN) {
            return answer(scanned, false);  // U+FFFD is not ASCII
        }
        String record = new String(raw, StandardCharsets.UTF_8);
        Object[] plain = scanned == NOT_PLAIN ? null : plainRecord(record);
        return answer(plain != null ? plain : variantFacts(record),
                      record.indexOf(REPLACEMENT) >= 0);
    }

    private static Row answer(Object[] facts, boolean markedInvalid) {
        facts[MARKED_INVALID] = markedInvalid;
        return RowFactory.create(facts);
    }

    private static final VarHandle EIGHT_BYTES =
        MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    private static final long HIGH_BITS = 0x8080808080808080L;
    private static final long LOW_BITS = 0x0101010101010101L;
    private static final long QUOTES = LOW_BITS * '"';
    private static final long BACKSLASHES = LOW_BITS * '\\';
    private static final long CONTROL_BOUND = LOW_BITS * 0x20;

    /** Non-zero if a byte of {@code eight} is zero (subtracting one borrows into its high
     * bit; the borrow may mark bytes above it too, so this says whether, not where). */
    private static long hasZeroByte(long eight) {
        return (eight - LOW_BITS) & ~eight & HIGH_BITS;
    }

    /**
     * Whether every byte of {@code raw} is ASCII and none is zero, eight at a time (a zero
     * byte is a character JSON does not allow unescaped anywhere: the scan leaves such a
     * record to Jackson, which says why).
     */
    public static boolean isAscii(byte[] raw) {
        int i = 0;
        for (; i + Long.BYTES <= raw.length; i += Long.BYTES) {
            long eight = (long) EIGHT_BYTES.get(raw, i);
            // A high bit is set, or a byte is zero.
            if (((eight & HIGH_BITS) | hasZeroByte(eight)) != 0) {
                return false;
            }
        }
        for (; i < raw.length; i++) {
            if (raw[i] <= 0) {
                return false;
            }
        }
        return true;
    }

    /** The facts of any record, read from its variant. */
    private Object[] variantFacts(String raw) {
        Object[] facts = new Object[FACTS];
        Variant record = parse(raw);
        facts[0] = record != null;
        if (record == null || record.getType() != VariantUtil.Type.OBJECT) {
            return facts;
        }
        facts[1] = record.objectSize();
        int known = 0;
        for (int i = 0; i < FIELDS.length; i++) {
            Variant value = record.getFieldByKey(FIELDS[i]);
            if (value == null) {
                continue;
            }
            known++;
            VariantUtil.Type type = value.getType();
            facts[kindAt(i)] = kindOf(type);
            facts[kindAt(i) + 1] = type == VariantUtil.Type.STRING ? value.getString()
                : text(cast(value, DataTypes.StringType));
            boolean number = isNumber(type);
            if (number && i == EVENT_TIME) {
                facts[EVENT_TIME_NUMBER] = type == VariantUtil.Type.LONG
                    ? (Object) (double) value.getLong() : cast(value, DataTypes.DoubleType);
            } else if (number && i == PRICE) {
                Object price = cast(value, PRICE_TYPE);
                facts[PRICE_NUMBER] =
                    price == null ? null : ((Decimal) price).toJavaBigDecimal();
            }
        }
        facts[2] = known;
        if (record.objectSize() > known) {
            facts[UNKNOWN_FIELDS] = unknownFields(record);
        }
        return facts;
    }

    /**
     * The facts of a plain record (an object whose keys are each once, whose values are JSON
     * strings or nulls, or an integer within a long for {@code event_time}), as
     * {@link #variantFacts} reads them from its variant; null for any other record.
     *
     * <p>The same answers by construction: {@code VariantBuilder.parseJson} reads the same
     * tokens with the same parser (a default {@code JsonFactory}, no look past the root
     * value), stores a string as {@code getText()} gives it and an integer within a long as
     * a long, whose text and double {@code try_variant_get} gives as Java does; a JSON
     * null's text is NULL. The variant orders an object's keys as {@code String.compareTo}
     * does ({@code VariantBuilder.finishWritingObject}), and writes a string as the default
     * generator's {@code writeString} ({@code Variant.escapeJson}). What the variant's way
     * checks beyond the tokens (duplicate keys, lone surrogates, size) does not arise here:
     * such records are not plain.
     */
    private static Object[] plainRecord(String raw) {
        if (raw.length() > PLAIN_AT_MOST) {
            return null;
        }
        Object[] facts = new Object[FACTS];
        try (JsonParser parser = JSON.createParser(raw)) {
            if (parser.nextToken() != JsonToken.START_OBJECT) {
                return null;
            }
            int seen = 0;  // a bit per contract field
            TreeMap<String, String> unknown = null;  // the other fields, in the variant's order
            for (JsonToken key = parser.nextToken(); key != JsonToken.END_OBJECT;
                 key = parser.nextToken()) {
                if (key != JsonToken.FIELD_NAME) {
                    return null;
                }
                String name = parser.currentName();
                Integer index = FIELD_INDEX.get(name);
                JsonToken value = parser.nextToken();
                if (index == null) {
                    if (unknown == null) {
                        unknown = new TreeMap<>();
                    }
                    if (unknown.containsKey(name) || hasSurrogate(name)) {
                        return null;
                    }
                    String text = value == JsonToken.VALUE_STRING ? parser.getText() : null;
                    if (value != JsonToken.VALUE_NULL && (text == null || hasSurrogate(text))) {
                        return null;
                    }
                    unknown.put(name, text);  // null: a JSON null
                    continue;
                }
                int field = index;
                if ((seen & (1 << field)) != 0) {
                    return null;
                }
                seen |= 1 << field;
                if (value == JsonToken.VALUE_STRING) {
                    String text = parser.getText();
                    if (hasSurrogate(text)) {
                        return null;
                    }
                    facts[kindAt(field)] = STRING;
                    facts[kindAt(field) + 1] = text;
                } else if (value == JsonToken.VALUE_NULL) {
                    facts[kindAt(field)] = JSON_NULL;
                } else if (value == JsonToken.VALUE_NUMBER_INT && field == EVENT_TIME
                           && WITHIN_A_LONG.contains(parser.getNumberType())) {
                    long millis = parser.getLongValue();
                    facts[kindAt(field)] = NUMBER;
                    facts[kindAt(field) + 1] = Long.toString(millis);
                    facts[EVENT_TIME_NUMBER] = (double) millis;
                } else {
                    return null;
                }
            }
            facts[0] = true;
            int known = Integer.bitCount(seen);
            facts[1] = known + (unknown == null ? 0 : unknown.size());
            facts[2] = known;
            if (unknown != null) {
                facts[UNKNOWN_FIELDS] = unknownFields(unknown);
            }
            return facts;
        } catch (IOException | RuntimeException notPlain) {  // the variant's way says why
            return null;
        }
    }

    /** What {@link #asciiRecord} answers for a record that takes the variant's way. */
    private static final Object[] NOT_PLAIN = new Object[0];

    /** The longest key the scan reads; Jackson refuses keys over 50,000 characters. */
    private static final int LONGEST_KEY = 1_000;
    /** The most digits the scan reads as an integer: any 18 digits fit in a long. */
    private static final int MOST_DIGITS = 18;
    /** The most fields the scan reads: Jackson refuses a record whose keys' hashes collide
     * in a chain longer than 150 of its symbol table (a guard against hash flooding), which
     * a record of at most 150 keys cannot make. */
    private static final int MOST_FIELDS = 150;

    /**
     * The facts of a plain record of ASCII (every byte ASCII and none zero) that spells every
     * token one way, as {@link #plainRecord} reads them with Jackson; null for any other,
     * which Jackson then reads.
     *
     * <p>What the scan accepts is a subset of what Jackson accepts, read as Jackson reads it:
     * an object of at most {@link #MOST_FIELDS} fields after JSON's whitespace (space, tab,
     * line feed, carriage return), keys and
     * string values between quotes with no backslash and no control character (so their text
     * is their bytes), {@code null}, and for {@code event_time} an integer of at most 18
     * digits without a sign or a leading zero (Jackson's long, whose text is its digits);
     * nothing after the object's end is read, as Jackson does not read past the root value.
     * Anything else (an escape, a sign, a fraction, a key twice, a long key, a missing
     * comma) declines: null, or {@link #NOT_PLAIN} where the record is not plain either.
     */
    static Object[] asciiRecord(byte[] raw) {
        if (raw.length > PLAIN_AT_MOST) {
            return null;
        }
        int at = afterSpace(raw, 0);
        if (at >= raw.length || raw[at] != '{') {
            return null;
        }
        Object[] facts = new Object[FACTS];
        int seen = 0;  // a bit per contract field
        // The other fields, in the variant's order: where each value's text is ({from, to}),
        // or null for a JSON null.
        TreeMap<String, int[]> unknown = null;
        at = afterSpace(raw, at + 1);
        boolean more = at < raw.length && raw[at] != '}';
        while (more) {
            int keyEnd = closingQuote(raw, at);
            if (keyEnd < 0 || keyEnd - at - 1 > LONGEST_KEY) {
                return null;
            }
            String name = new String(raw, at + 1, keyEnd - at - 1, StandardCharsets.ISO_8859_1);
            at = afterSpace(raw, keyEnd + 1);
            if (at >= raw.length || raw[at] != ':') {
                return null;
            }
            at = afterSpace(raw, at + 1);
            if (at >= raw.length) {
                return null;
            }
            Integer index = FIELD_INDEX.get(name);
            String kind;
            String text = null;
            int[] slice = null;
            long millis = 0;
            int valueEnd;
            byte first = raw[at];
            if (first == '"') {
                int end = closingQuote(raw, at);
                if (end < 0) {
                    return null;
                }
                kind = STRING;
                slice = new int[] {at + 1, end};
                if (index != null) {
                    text = new String(raw, at + 1, end - at - 1, StandardCharsets.ISO_8859_1);
                }
                valueEnd = end + 1;
            } else if (first == 'n' && at + 4 <= raw.length && raw[at + 1] == 'u'
                       && raw[at + 2] == 'l' && raw[at + 3] == 'l') {
                kind = JSON_NULL;
                valueEnd = at + 4;
            } else if (first >= '0' && first <= '9') {
                valueEnd = at;
                while (valueEnd < raw.length && raw[valueEnd] >= '0' && raw[valueEnd] <= '9') {
                    millis = millis * 10 + (raw[valueEnd++] - '0');
                }
                if (valueEnd - at > MOST_DIGITS || (first == '0' && valueEnd - at > 1)) {
                    return null;
                }
                kind = NUMBER;
                text = Long.toString(millis);
            } else {
                // An object, an array, true or false: Jackson's plain way, reading the same
                // tokens up to here, would refuse it too.
                return first == '{' || first == '[' || first == 't' || first == 'f'
                    ? NOT_PLAIN : null;
            }
            if (index == null) {
                if (unknown == null) {
                    unknown = new TreeMap<>();
                }
                if (kind == NUMBER || unknown.containsKey(name)
                    || unknown.size() + FIELDS.length >= MOST_FIELDS) {
                    return null;
                }
                unknown.put(name, slice);
            } else {
                int field = index;
                if ((seen & (1 << field)) != 0 || (kind == NUMBER && field != EVENT_TIME)) {
                    return null;
                }
                seen |= 1 << field;
                facts[kindAt(field)] = kind;
                facts[kindAt(field) + 1] = text;
                if (kind == NUMBER) {
                    facts[EVENT_TIME_NUMBER] = (double) millis;
                }
            }
            // After a value: a comma and the next key, or the object's end. Anything else
            // (a fraction, an exponent, more letters after null) declines.
            at = afterSpace(raw, valueEnd);
            if (at >= raw.length) {
                return null;
            }
            if (raw[at] == ',') {
                at = afterSpace(raw, at + 1);
            } else if (raw[at] == '}') {
                more = false;
            } else {
                return null;
            }
        }
        if (at >= raw.length) {
            return null;  // no closing brace
        }
        facts[0] = true;
        int known = Integer.bitCount(seen);
        facts[1] = known + (unknown == null ? 0 : unknown.size());
        facts[2] = known;
        if (unknown != null) {
            facts[UNKNOWN_FIELDS] = unknownFields(raw, unknown);
        }
        return facts;
    }

    /**
     * The scanned record's fields the contract does not name, as {@link #unknownFields(TreeMap)}
     * writes them: Jackson's generator escapes only quotes, backslashes and control
     * characters, which neither these keys nor these values hold, so it writes their bytes.
     */
    private static String unknownFields(byte[] raw, TreeMap<String, int[]> fields) {
        int size = 1;
        for (Map.Entry<String, int[]> field : fields.entrySet()) {
            int[] value = field.getValue();
            size += field.getKey().length() + 4 + (value == null ? 4 : value[1] - value[0] + 2);
        }
        byte[] json = new byte[size];
        int at = 0;
        json[at++] = '{';
        for (Map.Entry<String, int[]> field : fields.entrySet()) {
            if (at > 1) {
                json[at++] = ',';
            }
            json[at++] = '"';
            byte[] key = field.getKey().getBytes(StandardCharsets.ISO_8859_1);
            System.arraycopy(key, 0, json, at, key.length);
            at += key.length;
            json[at++] = '"';
            json[at++] = ':';
            int[] value = field.getValue();
            if (value == null) {
                System.arraycopy(NULL, 0, json, at, NULL.length);
                at += NULL.length;
            } else {
                json[at++] = '"';
                System.arraycopy(raw, value[0], json, at, value[1] - value[0]);
                at += value[1] - value[0];
                json[at++] = '"';
            }
        }
        json[at++] = '}';
        return new String(json, 0, at, StandardCharsets.ISO_8859_1);
    }

    private static final byte[] NULL = {'n', 'u', 'l', 'l'};

    /** The first position from {@code at} that is not JSON's whitespace. */
    private static int afterSpace(byte[] raw, int at) {
        while (at < raw.length
               && (raw[at] == ' ' || raw[at] == '\n' || raw[at] == '\r' || raw[at] == '\t')) {
            at++;
        }
        return at;
    }

    /** Where the string opened by a quote at {@code at} closes; -1 where there is no quote
     * at {@code at}, or the string holds a backslash or a control character, or is open. */
    private static int closingQuote(byte[] raw, int at) {
        if (at >= raw.length || raw[at] != '"') {
            return -1;
        }
        int i = at + 1;
        // Eight bytes at a time past those that cannot end the string (the record is ASCII,
        // so a byte's high bit is clear): the contract's longest records are one value.
        for (; i + Long.BYTES <= raw.length; i += Long.BYTES) {
            long eight = (long) EIGHT_BYTES.get(raw, i);
            if ((hasZeroByte(eight ^ QUOTES) | hasZeroByte(eight ^ BACKSLASHES)
                 | ((eight - CONTROL_BOUND) & ~eight & HIGH_BITS)) != 0) {
                break;  // one of these eight is: find it a byte at a time
            }
        }
        for (; i < raw.length; i++) {
            byte b = raw[i];
            if (b == '"') {
                return i;
            }
            if (b == '\\' || b < 0x20) {
                return -1;
            }
        }
        return -1;
    }

    private static boolean hasSurrogate(String text) {
        for (int i = 0; i < text.length(); i++) {
            if (Character.isSurrogate(text.charAt(i))) {
                return true;
            }
        }
        return false;
    }

    /**
     * The fields of {@code record} the contract does not name, as {@code to_json} writes a
     * {@code map<string,variant>} of them: in the variant's order of keys, each value's JSON
     * as the variant writes it.
     */
    private static String unknownFields(Variant record) {
        return jsonObject(json -> {
            for (int i = 0; i < record.objectSize(); i++) {
                Variant.ObjectField field = record.getFieldAtIndex(i);
                if (!FIELD_INDEX.containsKey(field.key)) {
                    json.writeFieldName(field.key);
                    json.writeRawValue(field.value.toJson(ZoneOffset.UTC));
                }
            }
        });
    }

    /** A plain record's fields the contract does not name, each a string or a JSON null
     * (null), in the variant's order of keys: as {@link #unknownFields(Variant)} writes
     * them from the variant. */
    private static String unknownFields(TreeMap<String, String> fields) {
        return jsonObject(json -> {
            for (Map.Entry<String, String> field : fields.entrySet()) {
                json.writeFieldName(field.getKey());
                if (field.getValue() == null) {
                    json.writeNull();
                } else {
                    json.writeString(field.getValue());
                }
            }
        });
    }

    @FunctionalInterface
    private interface Fields {
        void write(JsonGenerator json) throws IOException;
    }

    private static String jsonObject(Fields fields) {
        StringWriter text = new StringWriter();
        try (JsonGenerator json = JSON.createGenerator(text)) {
            json.writeStartObject();
            fields.write(json);
            json.writeEndObject();
        } catch (IOException cannotHappen) {  // a StringWriter does not fail
            throw new UncheckedIOException(cannotHappen);
        }
        return text.toString();
    }

    /** The record as {@code try_parse_json} reads it, or null where that gives NULL. */
    private Variant parse(String raw) {
        if (raw == null) {
            return null;
        }
        try {
            return VariantBuilder.parseJson(raw, allowDuplicateKeys, validateUnicode);
        } catch (Exception notJson) {  // try_parse_json: any non-fatal failure is a NULL
            return null;
        }
    }

    private static boolean isNumber(VariantUtil.Type type) {
        return type == VariantUtil.Type.LONG || type == VariantUtil.Type.DOUBLE
            || type == VariantUtil.Type.DECIMAL || type == VariantUtil.Type.FLOAT;
    }

    /** STRING, NUMBER, VOID (JSON null), or the variant's type: BOOLEAN, OBJECT, ARRAY. */
    private static String kindOf(VariantUtil.Type type) {
        if (isNumber(type)) {
            return NUMBER;
        }
        return type == VariantUtil.Type.NULL ? JSON_NULL : type.name();
    }

    /** {@code try_variant_get(value, '$', type)}. */
    private static Object cast(Variant value, DataType type) {
        return VariantGet$.MODULE$.cast(value, type, TRY);
    }

    private static String text(Object utf8) {
        return utf8 == null ? null : utf8.toString();
    }

    // try_variant_get's arguments: NULL instead of an error; the zone matters only for
    // timestamps, which JSON does not have.
    private static final VariantCastArgs TRY =
        VariantCastArgs.apply(false, Option.apply("UTC"), ZoneOffset.UTC);
}
