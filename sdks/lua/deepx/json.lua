-- JSON for the SDK, in Lua: numbers keep their kind both ways (an integer is written and
-- read as an integer, 2.0 as a float), so graph specs come out as written and int64 values
-- are exact; and arrays are told from objects, empty ones too. (cjson reads every number
-- as a float and writes an empty table as {}, which a spec's "args": [] is not.)
--
-- Read: objects are tables with json.object_mt, arrays tables with json.array_mt, null is
-- json.null. Written: a table with array_mt is an array; with object_mt an object; any other
-- table an array where it is a sequence (an empty one too) and else an object, keys sorted
-- (as Go writes maps); json.raw(text) is written as the text itself.

local json = {}

json.null = setmetatable({}, { __name = "json.null", __tostring = function() return "null" end })
json.array_mt = { __name = "json.array" }
json.object_mt = { __name = "json.object" }
local raw_mt = { __name = "json.raw" }

--- t (or a new table) marked as a JSON array.
function json.array(t) return setmetatable(t or {}, json.array_mt) end

--- t (or a new table) marked as a JSON object.
function json.object(t) return setmetatable(t or {}, json.object_mt) end

--- JSON text written as it is where a value holds it (a graph spec already written).
function json.raw(text) return setmetatable({ text = text }, raw_mt) end

local function fail(message) error({ json = true, message = message }, 0) end

-- Writing --------------------------------------------------------------------------------

local escapes = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f",
  ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }

local function quote(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return escapes[c] or string.format("\\u%04x", c:byte())
  end) .. '"'
end
json.quote = quote

--- A float as JSON writes it: the fewest digits that read back the same, and ".0" where
-- those look like an integer (so it reads back as a float).
function json.float(v)
  if v ~= v or v == math.huge or v == -math.huge then
    fail("JSON has no " .. tostring(v))
  end
  local text
  for digits = 15, 17 do
    text = string.format("%." .. digits .. "g", v)
    if tonumber(text) == v then break end
  end
  if not text:find("[%.eE]") then text = text .. ".0" end
  return text
end

local function sequence_length(t)
  local n = #t
  local count = 0
  for _ in pairs(t) do count = count + 1 end
  if count ~= n then return nil end
  return n
end

local write

local function write_array(t, n, out, depth)
  out[#out + 1] = "["
  for i = 1, n do
    if i > 1 then out[#out + 1] = "," end
    write(t[i], out, depth + 1)
  end
  out[#out + 1] = "]"
end

local function write_object(t, out, depth)
  local keys = {}
  for k in pairs(t) do
    if type(k) ~= "string" then fail("an object's key is a " .. type(k) .. ", not a string") end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  out[#out + 1] = "{"
  for i, k in ipairs(keys) do
    if i > 1 then out[#out + 1] = "," end
    out[#out + 1] = quote(k)
    out[#out + 1] = ":"
    write(t[k], out, depth + 1)
  end
  out[#out + 1] = "}"
end

function write(v, out, depth)
  if depth > 64 then fail("a value nested too deep (or in itself)") end
  local kind = type(v)
  if v == nil or v == json.null then
    out[#out + 1] = "null"
  elseif kind == "boolean" then
    out[#out + 1] = v and "true" or "false"
  elseif kind == "number" then
    out[#out + 1] = math.type(v) == "integer" and string.format("%d", v) or json.float(v)
  elseif kind == "string" then
    out[#out + 1] = quote(v)
  elseif kind == "table" then
    local mt = getmetatable(v)
    if mt == raw_mt then
      out[#out + 1] = v.text
    elseif mt == json.array_mt then
      write_array(v, #v, out, depth)
    elseif mt == json.object_mt then
      write_object(v, out, depth)
    else
      local n = sequence_length(v)
      if n then write_array(v, n, out, depth) else write_object(v, out, depth) end
    end
  else
    fail("JSON has no " .. kind)
  end
end

--- The JSON text of a value.
function json.encode(v)
  local out = {}
  write(v, out, 0)
  return table.concat(out)
end

-- Reading --------------------------------------------------------------------------------

local unescapes = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n",
  r = "\r", t = "\t" }

--- The value of JSON text; raises {json = true, message = ...} where it is not JSON.
-- options.drop_nulls: an object's null fields are left out (nil) rather than json.null.
function json.decode(s, options)
  local drop_nulls = options and options.drop_nulls
  local pos = 1
  local value

  local function skip()
    pos = s:find("[^ \t\r\n]", pos) or #s + 1
  end

  local function string_at()
    local parts, i = {}, pos + 1
    while true do
      local j = s:find('["\\]', i)
      if not j then fail("an unterminated string at " .. pos) end
      parts[#parts + 1] = s:sub(i, j - 1)
      if s:sub(j, j) == '"' then
        pos = j + 1
        return table.concat(parts)
      end
      local c = s:sub(j + 1, j + 1)
      if c == "u" then
        local code = tonumber(s:sub(j + 2, j + 5), 16)
        if not code then fail("a bad \\u escape at " .. j) end
        i = j + 6
        if code >= 0xD800 and code <= 0xDBFF and s:sub(i, i + 1) == "\\u" then
          local low = tonumber(s:sub(i + 2, i + 5), 16)
          if low and low >= 0xDC00 and low <= 0xDFFF then
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
            i = i + 6
          end
        end
        parts[#parts + 1] = utf8.char(code)
      elseif unescapes[c] then
        parts[#parts + 1] = unescapes[c]
        i = j + 2
      else
        fail("a bad escape at " .. j)
      end
    end
  end

  local function number_at()
    local int = s:match("^-?%d+", pos)
    if not int then fail("unexpected " .. s:sub(pos, pos + 10) .. " at " .. pos) end
    local rest = pos + #int
    local frac = s:match("^%.%d+", rest) or ""
    rest = rest + #frac
    local exp = s:match("^[eE][-+]?%d+", rest) or ""
    local text = s:sub(pos, rest + #exp - 1)
    pos = rest + #exp
    if frac == "" and exp == "" then
      -- (an integer past int64 reads as the nearest float, as Lua's own tonumber does)
      return math.tointeger(tonumber(text)) or tonumber(text)
    end
    return tonumber(text) -- (a float: a fraction or an exponent; -0.0 keeps its sign)
  end

  function value()
    skip()
    local c = s:sub(pos, pos)
    if c == "{" then
      local t = json.object()
      pos = pos + 1
      skip()
      if s:sub(pos, pos) == "}" then pos = pos + 1 return t end
      while true do
        skip()
        if s:sub(pos, pos) ~= '"' then fail("an object's key is not a string at " .. pos) end
        local k = string_at()
        skip()
        if s:sub(pos, pos) ~= ":" then fail("no ':' at " .. pos) end
        pos = pos + 1
        local v = value()
        if not (drop_nulls and v == json.null) then t[k] = v end
        skip()
        c = s:sub(pos, pos)
        pos = pos + 1
        if c == "}" then return t end
        if c ~= "," then fail("no ',' or '}' at " .. (pos - 1)) end
      end
    elseif c == "[" then
      local t, n = json.array(), 0
      pos = pos + 1
      skip()
      if s:sub(pos, pos) == "]" then pos = pos + 1 return t end
      while true do
        n = n + 1
        t[n] = value()
        skip()
        c = s:sub(pos, pos)
        pos = pos + 1
        if c == "]" then return t end
        if c ~= "," then fail("no ',' or ']' at " .. (pos - 1)) end
      end
    elseif c == '"' then
      return string_at()
    elseif s:sub(pos, pos + 3) == "true" then
      pos = pos + 4
      return true
    elseif s:sub(pos, pos + 4) == "false" then
      pos = pos + 5
      return false
    elseif s:sub(pos, pos + 3) == "null" then
      pos = pos + 4
      return json.null
    end
    return number_at()
  end

  local result = value()
  skip()
  if pos <= #s then fail("text after the value at " .. pos) end
  return result
end

return json
