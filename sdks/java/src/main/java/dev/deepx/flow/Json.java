package dev.deepx.flow;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParseException;
import com.google.gson.JsonParser;
import com.google.gson.JsonPrimitive;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;

/**
 * JSON as the SDK writes and reads it (gson): plain Java values both ways, Maps, Lists,
 * Strings, Booleans and Numbers, numbers kept as written (an integer stays a Long, or a
 * BigInteger past Long's range, never rounded through a double; 2.0 stays a Double).
 */
public final class Json {
  private static final Gson GSON = new GsonBuilder().disableHtmlEscaping().create();
  private static final Pattern INTEGER = Pattern.compile("-?[0-9]+");

  private Json() {}

  /** {@code value} (Maps, Lists, arrays, Strings, Numbers, Booleans) as compact JSON. */
  public static String write(Object value) {
    return GSON.toJson(value);
  }

  /** The plain Java value of JSON {@code text}. */
  public static Object parse(String text) {
    try {
      return plain(JsonParser.parseString(text));
    } catch (JsonParseException e) {
      throw new DeepxException("RemoteError", "not JSON: " + e.getMessage());
    }
  }

  /** The plain Java value of a parsed JSON element. */
  public static Object plain(JsonElement element) {
    if (element == null || element.isJsonNull()) {
      return null;
    }
    if (element.isJsonObject()) {
      Map<String, Object> out = new LinkedHashMap<>();
      for (Map.Entry<String, JsonElement> e : ((JsonObject) element).entrySet()) {
        out.put(e.getKey(), plain(e.getValue()));
      }
      return out;
    }
    if (element.isJsonArray()) {
      List<Object> out = new ArrayList<>();
      for (JsonElement e : (JsonArray) element) {
        out.add(plain(e));
      }
      return out;
    }
    JsonPrimitive p = (JsonPrimitive) element;
    if (p.isBoolean()) {
      return p.getAsBoolean();
    }
    if (p.isString()) {
      return p.getAsString();
    }
    return number(p.getAsString());
  }

  /** A JSON number's text as a Long (a BigInteger past its range) or a Double. */
  public static Number number(String text) {
    if (INTEGER.matcher(text).matches()) {
      try {
        return Long.parseLong(text);
      } catch (NumberFormatException e) {
        return new BigInteger(text);
      }
    }
    return Double.parseDouble(text);
  }

  @SuppressWarnings("unchecked")
  static <T> T copy(T value) {
    return (T) parse(write(value));
  }
}
